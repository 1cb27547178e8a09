"""The AWS CDK side: one environment (stack) per team of the teams file.

Owns: the typed teams config and its checks, one construct per module (network, cluster, GPU node group,
add-ons, shared storage, the trainer's Helm release), the stacks and cdk-nag (docs/infra.md).
May import: the standard library, aws-cdk-lib, constructs, pydantic, PyYAML, ``sizing`` (the storage
sizing of the checkpoint cadence). Never ``trainer`` (synth needs no torch), ``tools``, ``bench`` or
``goodput``; it reads the chart under k8s/ as files, and sets its values only as Contract 1 of
docs/design.md says.
"""
