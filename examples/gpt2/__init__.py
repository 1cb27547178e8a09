"""GPT-2 (Hugging Face transformers, built from its config, no downloaded weights) trained with FSDP2:
`before.py` is a typical team script, `train.py` the same script ported to trainer.api
(docs/bring-your-own.md shows the diff)."""
