"""The network: layer specs, their numba kernels, the parameter layout, connection count."""
