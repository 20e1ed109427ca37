"""The walls between tenants on one machine (DESIGN §10, seed 001 "Keeping tenants apart").

One module per wall, so each can be read, tested and argued about on its own:

- :mod:`.users`     its own unprivileged user and group per slot;
- :mod:`.sandbox`   its own PID, mount, IPC, UTS and network namespaces (bubblewrap);
- :mod:`.cgroups`   its own cgroup with a memory and a pids limit, killed whole;
- :mod:`.network`   the tunnels out of a closed network and the egress filter;
- :mod:`.devices`   only the slot's own GPU device nodes;
- :mod:`.wipe`      clean before and after, without following a planted symlink;
- :mod:`.pipelines` the pipeline's code, installed read-only once per version;
- :mod:`.launcher`  the :class:`~gpufleet.agent.launcher.SlotLauncher` that puts them together.
"""
