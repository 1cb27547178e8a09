"""The test suite, one folder per part: infra/, chart/ (k8s/), image/ (Dockerfile), trainer/, tools/,
bench/, goodput/; tests of the whole layout at the top.

Shared fixtures live in ``conftest.py`` files, which nothing imports; shared helpers live in plain modules
that are not test modules (``tests/helpers.py``, ``tests/chart/helm.py``, ``tests/trainer/_jobs.py``, ...).
A test module never imports another test module; tests/trainer/<sub>/ mirrors trainer/<sub>/. Under
``make test`` (BLUEPRINT_REQUIRE_TOOLS=1) a test that needs helm or the CDK CLI fails when the tool is
missing, it never skips.
"""
