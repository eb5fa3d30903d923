"""The network: layer specifications, their numba kernels, the parameter layout, connection count."""
