# The test slice every supported Python besides the main one runs (sourced by
# .ci/python-versions.sh and .ci/python-3.14.sh; paths relative to the repository):
# the unit tests that need no cluster, and a testbed slice (a cluster start with the
# testbed's certificates, the testbed's clusters, provider-file's conformance suite).
# shellcheck disable=SC2034  # used by the scripts that source this
unit=(
  packages/mcruntime-core/tests/test_backoff_and_supervision.py
  packages/mcruntime-core/tests/test_builder.py
  packages/mcruntime-core/tests/test_cluster_start_failures.py
  packages/mcruntime-core/tests/test_controller_lanes.py
  packages/mcruntime-core/tests/test_errors.py
  packages/mcruntime-core/tests/test_heartbeat.py
  packages/mcruntime-core/tests/test_kubeconfig.py
  packages/mcruntime-core/tests/test_labels.py
  packages/mcruntime-core/tests/test_limits.py
  packages/mcruntime-core/tests/test_metrics_series.py
  packages/mcruntime-core/tests/test_objects.py
  packages/mcruntime-core/tests/test_predicates.py
  packages/mcruntime-core/tests/test_provider_kit.py
  packages/mcruntime-core/tests/test_public_api.py
  packages/mcruntime-core/tests/test_ratelimit.py
  packages/mcruntime-core/tests/test_rendezvous.py
  packages/mcruntime-core/tests/test_settings_reach_controllers.py
  packages/mcruntime-core/tests/test_workqueue.py
  packages/mcruntime-core/tests/test_workqueue_lanes.py
  tests/test_migration_guide.py
)
testbed=(
  packages/mcruntime-core/tests/test_testbed_pki.py
  packages/mcruntime-core/tests/test_testbed_clusters.py
  packages/provider-file/tests/test_conformance.py
)
