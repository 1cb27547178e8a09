"""The trainer's configuration: one declaration per setting, the command line generated from it, and the
checks that stop a bad input in one line before any process group starts.

- errors.py:       `UnrecoverableError` (what no restart fixes), the exit statuses, the one-line message;
- settings.py:     `setting(...)`, the declaration (flag, doc, bounds, chart value), and `ConfigError`;
- flags.py:        the argparse whose every rejection is one `config error: <field>: why` line;
- inputs.py:       the input primitives (files, directories, seconds, environment settings);
- components.py:   the library's components (run, metrics, faults), the chart-to-trainer table;
- train_config.py: `TrainConfig`, composing every component (those of trainer/checkpoint/, snapshot/ and
  resilience/ are declared beside their code), and `config_from_args`.

errors.py, settings.py and flags.py sit below every other trainer package (the component configs of
checkpoint/, snapshot/ and resilience/ import them); components.py and train_config.py sit above those
component configs and the fault specs (trainer/runtime/faults.py). The model, its data and its
optimizer are not here: they are the training function's (the reference model's are declared in
trainer/reference/config.py), so nothing here imports trainer/reference/. No torch and no process
group: `--check-config` imports all of it.
"""
