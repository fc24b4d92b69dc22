#!/usr/bin/env bash
# The packages as a user gets them: build every distribution (wheel and sdist),
# check their metadata, then install from the built wheels into fresh virtual
# environments outside the workspace and run, from a directory outside the repo:
#   1. mcruntime-core WITHOUT the `testing` extra, plus pytest: a plain test passes
#      (the pytest11 plugin loads), and a test using a testbed fixture fails with a
#      message naming `pip install 'mcruntime-core[testing]'`;
#   2. mcruntime-core[testing] plus mcruntime-provider-file: the configmap-logger
#      example's test and provider-file's conformance suite, against the testbed.
# Our packages come only from the built wheels (--no-index); their third-party
# dependencies come from PyPI. The first two venvs are made with pip, as most users make
# theirs; the check that each distribution installs on its own uses uv. Usage: .ci/installed-wheels.sh [python]  (default python3)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
started=$SECONDS

scratch=$(mktemp -d "${TMPDIR:-/tmp}/mcruntime-wheels.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
dist=$scratch/dist

echo "--- build: wheel and sdist of every package into $dist"
for package in "$repo"/packages/*/; do
  (cd "$package" && hatch build -t wheel -t sdist "$dist" >/dev/null)
done
ls "$dist"

echo "--- metadata: license file, authors, URLs, classifiers, py.typed in every distribution"
"$python" - "$dist" <<'EOF'
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

dist = Path(sys.argv[1])
problems = []
wheels = sorted(dist.glob("*.whl"))
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(name.rsplit("/", 1)[0] for name in names if name.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        record = archive.read(f"{info}/RECORD").decode()
    need = {
        "License-Expression: Apache-2.0": meta["License-Expression"] == "Apache-2.0",
        "License-File: LICENSE": "LICENSE" in (meta.get_all("License-File") or []),
        "licenses/LICENSE in RECORD": f"{info}/licenses/LICENSE," in record,
        "py.typed in RECORD": any(line.split(",")[0].endswith("/py.typed") for line in record.splitlines()),
        "Author": bool(meta["Author"] or meta["Author-email"]),
        "Project-URL Repository": any(u.startswith("Repository, ") for u in meta.get_all("Project-URL") or []),
        "Project-URL Changelog": any(u.startswith("Changelog, ") for u in meta.get_all("Project-URL") or []),
        "Development Status": any(c.startswith("Development Status :: ") for c in meta.get_all("Classifier") or []),
        "Typing :: Typed": "Typing :: Typed" in (meta.get_all("Classifier") or []),
        "Python 3.11": "Programming Language :: Python :: 3.11" in (meta.get_all("Classifier") or []),
    }
    if meta["Name"] != "mcruntime-core":
        core = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("mcruntime-core")]
        need["Requires-Dist mcruntime-core<3,>=2.0"] = core == ["mcruntime-core<3,>=2.0"]
    problems += [f"{wheel.name}: no {what}" for what, ok in need.items() if not ok]
    sdist = dist / f"{wheel.name.split('-')[0]}-{meta['Version']}.tar.gz"
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    for wanted in ("LICENSE", "PKG-INFO", "CHANGELOG.md", "README.md"):
        if not any(member.endswith(f"/{wanted}") and member.count("/") == 1 for member in members):
            problems.append(f"{sdist.name}: no top-level {wanted}")
    print(f"{meta['Name']} {meta['Version']}: {len(need)} metadata checks, sdist {sdist.name}")
if problems:
    sys.exit("metadata incomplete:\n  " + "\n  ".join(problems))
EOF

# A fresh venv with our packages from the wheels only and their dependencies from PyPI.
fresh_venv() {
  local venv=$1
  shift
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-index --no-deps --find-links "$dist" "$@"
  # Already satisfied from the wheels above, so only third-party packages come from PyPI.
  "$venv/bin/pip" install --quiet --find-links "$dist" "$@"
  "$venv/bin/pip" check
}

# The same with uv (installed with hatch), for the check of each distribution alone: the
# resolution is the same metadata's, and seven venvs take seconds instead of minutes with pip.
alone_venv() {
  local venv=$1
  shift
  uv venv --quiet --python "$python" "$venv"
  uv pip install --quiet --python "$venv/bin/python" --no-index --no-deps --find-links "$dist" "$@"
  uv pip install --quiet --python "$venv/bin/python" --find-links "$dist" "$@"
  uv pip check --quiet --python "$venv/bin/python"
}

outside=$scratch/outside-the-repo
mkdir -p "$outside"
cd "$outside"

echo "--- core without the testing extra: pytest still runs; a testbed fixture names what to install"
fresh_venv "$scratch/venv-plain" mcruntime-core
"$scratch/venv-plain/bin/pip" install --quiet pytest
if "$scratch/venv-plain/bin/python" -c "import cryptography" 2>/dev/null; then
  echo "error: cryptography is installed without the testing extra; this check would prove nothing" >&2
  exit 1
fi
mkdir -p plain
cat >plain/test_plain.py <<'EOF'
def test_arithmetic() -> None:
    assert 2 + 2 == 4
EOF
cat >plain/test_testbed_fixture.py <<'EOF'
def test_uses_the_shared_fleet(fleet: object) -> None:
    assert fleet
EOF
"$scratch/venv-plain/bin/python" -m pytest -p no:cacheprovider -q plain/test_plain.py
set +e
"$scratch/venv-plain/bin/python" -m pytest -p no:cacheprovider -q plain/test_testbed_fixture.py >plain.log 2>&1
status=$?
set -e
sed "s/^/  (expected) /" plain.log
if [ "$status" -ne 1 ] || ! grep -q "pip install 'mcruntime-core\[testing\]'" plain.log; then
  echo "error: a testbed fixture without the testing extra should fail (exit 1) naming the extra; exit $status" >&2
  exit 1
fi

echo "--- core[testing] + provider-file from the wheels: configmap-logger and the conformance suite"
venv=$scratch/venv-testing
fresh_venv "$venv" "mcruntime-core[testing]" mcruntime-provider-file
"$venv/bin/pip" install --quiet "pytest-timeout>=2.4"
"$venv/bin/python" - "$venv" <<'EOF'
import sys
import mcruntime, mcruntime_file
from importlib.metadata import version
for module in (mcruntime, mcruntime_file):
    assert module.__file__ and module.__file__.startswith(sys.argv[1]), f"{module.__name__} imported from {module.__file__}"
print(f"mcruntime {mcruntime.__version__} and mcruntime_file {version('mcruntime-provider-file')} from {sys.argv[1]}")
EOF
# The tests and the example's sources, copied: the packages under test come from the venv.
mkdir -p suite
cp "$repo/examples/example_testing.py" \
  "$repo/examples/configmap-logger/configmap_logger.py" \
  "$repo/examples/configmap-logger/test_configmap_logger.py" \
  "$repo/packages/provider-file/tests/test_conformance.py" suite/
cat >suite/pytest.ini <<'EOF'
[pytest]
addopts = -ra --strict-markers --strict-config
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
timeout = 300
EOF
(cd suite && "$venv/bin/python" -m pytest -p no:cacheprovider -q \
  test_configmap_logger.py test_conformance.py)

echo "--- every distribution installs on its own (our wheels, dependencies from PyPI) and imports"
for spec in mcruntime-core:mcruntime mcruntime-provider-file:mcruntime_file \
  mcruntime-provider-kind:mcruntime_kind mcruntime-provider-capi:mcruntime_capi \
  mcruntime-provider-clusterprofile:mcruntime_clusterprofile \
  mcruntime-provider-kubefed:mcruntime_kubefed mcruntime-provider-namespace:mcruntime_namespace; do
  name=${spec%%:*} module=${spec##*:}
  [ "$name" = mcruntime-core ] && requirement=$name || requirement="$name mcruntime-core"
  rm -rf "$scratch/venv-alone"
  # shellcheck disable=SC2086  # the core comes from the wheels too, not from PyPI
  alone_venv "$scratch/venv-alone" $requirement
  "$scratch/venv-alone/bin/python" -c "import $module; print('$name installs on its own and imports as $module')"
done

echo "installed wheels: passed in $((SECONDS - started))s"
