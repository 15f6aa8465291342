"""Who served a request: the traced processes and their service names, executables,
containers and Kubernetes pods."""
