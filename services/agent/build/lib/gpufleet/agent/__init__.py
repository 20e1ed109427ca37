"""gpufleet's agent: the one component that runs on a GPU machine.

Three kinds of process share one state directory (see ``statedir``) and the machine's
process group:

- the **agent daemon** (``python -m gpufleet.agent``) answers the control plane
  (``AgentService``: probes, utilisation samples, StartJob/CancelJob, ListRunners) and
  owns NVML; it starts the worker once and never resurrects it;
- the **worker** (``python -m gpufleet.agent.worker``) launches and adopts runners and
  reports for itself to the scheduler (``WorkerService``: heartbeats, completions);
- a **runner** per attempt (``python -m gpufleet.agent.runner``) runs the job behind the
  slot launcher (``launcher``, where the isolation walls go), times it, and writes its
  verdict.

Any of them can be killed at any moment: the state directory, written atomically, is
the truth each one recovers from.
"""
