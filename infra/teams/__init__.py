"""The teams file: typed, strictly validated configuration of every team's environment.

Modules by job: `loader` (bytes -> YAML -> models, one-line errors), `team` (a team and the file),
`nodes`, `network`, `storage` (the sections), `aws_rules` (AWS naming and network rules as pure
functions), `errors`. Import the public names from `infra.config`.
"""
