"""One parameter server process: its settings, its admission of requests, its receive pool, the
server itself, its command line (``hogwild ps``) and how tests and benchmarks launch one.

This subpackage sits above the rest of the plugin: the server owns the update engine, the shard
store and, with copies, the replication (:mod:`hogwild_plugins.ps.replication`); nothing below it
imports it, so the plugin's packages import one another in one direction only.
"""
