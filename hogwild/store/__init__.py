"""Parameter stores: where a worker's parameters come from and where its progress goes.

The seam is :class:`~hogwild.store.protocol.ParameterStore` (parent side) and
:class:`~hogwild.store.protocol.WorkerStore` (worker side), chosen by ``train.parameters``
through :mod:`hogwild.store.registry`. Public to plugins besides those two:
:class:`~hogwild.store.copies.CopiesStore` with :class:`~hogwild.store.exchange.Home` (a store of
copies exchanged with a home somewhere else; its module docstring says what a subclass may rely
on), and the kernels of :mod:`hogwild.store.kernels` a home uses to take and merge ranges.
"""
