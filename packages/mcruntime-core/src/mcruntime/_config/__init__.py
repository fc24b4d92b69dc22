"""Kubeconfigs: bounded parsing, trust policy, key material kept off disk, credentials and exec plugins."""
