"""Peers and controls: what a figure is measured against, from the same run (PyTorch's Hogwild,
PyTorch RPC and Ray parameter servers, raw pyzmq request/reply, private-model processes). A
figure script runs each, in process or as ``python bench/peers/NAME.py`` (one JSON line)."""
