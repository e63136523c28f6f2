"""One module per contender: ``ours``, ``inprocess`` (the limit, text in-process),
``pytriton`` and ``infinity``; each server contender is a context manager yielding a
running ``Server`` and the requests it takes per workload."""
