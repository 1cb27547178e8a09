"""Tests of trainer/events/: the event log and summary, the live Prometheus figures, the metrics
endpoint's process, a real Prometheus scrape, the start-up spans."""
