"""The run itself: what `python -m trainer` does after the configuration is valid, once per process and
once per attempt.

- entry.py:     the process's entry (`python -m trainer`, `api.main`): the function resolved, the options
                parsed and checked, the preflight, then the run;
- train.py:     the tier-1/tier-2 orchestration: each attempt calls the training function with a `Job`;
- job.py:       `RunningJob`, the api's `Job` view implemented over the internals, and the step loop;
- session.py:   one (re)start's distributed objects (process group, mesh, checkpoint loop);
- preflight.py: the start-up checks that need the file system but no process group, and the
                `JobConfig` a function and its check see;
- faults.py:    deterministic fault injection, off by default (a corrupted checkpoint included);
- failures.py:  what an exception that left an attempt becomes (frames dropped, one line, a refused resume);
- children.py:  a rank's helper processes end with it;
- ports.py:     free TCP ports for local runs.

Sits above api/ (whose `Job` it implements), checkpoint/, snapshot/, resilience/, events/ and digest/,
which it wires together.
"""
