"""The tests' harness: the daemon, the log builders, fakes of SGLang and the Kubernetes API, a real Prometheus and
Alertmanager, helm, podman. Test modules import from here, never from one another (tests/test_architecture.py).
"""
