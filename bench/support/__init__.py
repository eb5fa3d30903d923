"""What the figure scripts share: the record they print (:mod:`~bench.support.record`), the
machine and its limits (:mod:`~bench.support.machine`), the plots, running and watching jobs,
and counting what a run left behind. Nothing here is run on its own."""
