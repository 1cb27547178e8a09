"""Project scripts around the three parts: the demo, the local pod runner, the cluster smoke run, the
builder of the trainer's pod command from the rendered chart (podcommand), the helm installer.

May import: ``trainer`` (to read a run's events), ``goodput`` (the demo's prediction), ``sizing`` (the
smoke run's storage expectation), its own modules.
Never ``bench`` (benchmarks build on tools, not the other way round) and never ``infra`` (the demo
synthesizes through the CDK CLI, as a user does).
"""
