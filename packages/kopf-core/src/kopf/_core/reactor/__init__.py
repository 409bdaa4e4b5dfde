"""
The reactor: the topmost layer of the framework, which brings the operator into motion.

* ``running``: the entry points (``kopf.run``, ``kopf.operator``, ``kopf.spawn_tasks``, ``kopf.run_tasks``)
  and the operator's life: startup, the core tasks, stopping, cleanup.
* ``observation``: the discovery of the resources and namespaces to serve, at the start and at runtime.
* ``orchestration``: one watcher per resource & namespace that needs watching.
* ``queueing``: the watchers, which multiplex the watch-streams into per-object workers.
* ``processing``: one object's event: event handlers, then the change-handling cycle.
* ``inventory``: the per-object in-memory state (``kopf.ResourceMemories``).
"""
