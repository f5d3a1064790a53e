"""An OTLP/HTTP trace receiver for the tracing e2e tests: a real protocol peer built on the
OpenTelemetry project's own protobuf definitions (PyPI opentelemetry-proto), not on Sluice's
code.

It serves POST /v1/traces (application/x-protobuf, gzip accepted), decodes each
ExportTraceServiceRequest, answers with an ExportTraceServiceResponse, and appends one JSON
line per span to --out:

    {"service": ..., "scope": ..., "trace_id": hex, "span_id": hex, "parent_span_id": hex,
     "name": ..., "kind": int, "start_ns": int, "end_ns": int, "status": int,
     "attributes": {key: value}}

The first line of stdout is the port it listens on (127.0.0.1 only; --port 0 picks one).

Misbehaving on purpose, for the tests of a collector that is not well: --max-spans N answers
413 (Payload Too Large) to a request of more than N spans and keeps none of them, as a
collector with a request size limit does; --stall-first S holds the first request S seconds
and keeps none of its spans.
"""

import argparse
import gzip
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

LOCK = threading.Lock()


def value(any_value):
    """An AnyValue as plain JSON."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def spans(request):
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "scope": scope_spans.scope.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": span.kind,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "status": span.status.code,
                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                }


def handler(out_path, max_spans, stall_first):
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            with LOCK:
                requests.append(self.path)
                first = len(requests) == 1
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as error:  # a malformed request is the relay's bug: say so
                self.send_error(400, str(error))
                return
            received = list(spans(request))
            if first and stall_first:
                time.sleep(stall_first)
                self.send_error(503)
                return
            if max_spans is not None and len(received) > max_spans:
                self.send_error(413, f"{len(received)} spans, at most {max_spans}")
                return
            with LOCK, open(out_path, "a", encoding="utf-8") as out:
                for span in received:
                    out.write(json.dumps(span) + "\n")
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-spans", type=int, default=None)
    parser.add_argument("--stall-first", type=float, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), handler(args.out, args.max_spans, args.stall_first)
    )
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
