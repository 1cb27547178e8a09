"""Keys and message authentication for what the trainer reads from places others can write
(docs/design.md Contract 5, docs/security.md).

- keys.py: key files (the chart mounts them from Secrets; a local run creates its checkpoint key),
           read without following links or blocking, size-checked; errors name the env var.
- mac.py:  HMAC-SHA256 of a JSON document (checkpoint manifests, NVMe seals), streaming file digests.

No torch: `--check-config` imports this.
"""
