"""Finished spans as an OTLP `ExportTraceServiceRequest`, protobuf bytes written directly.

The OpenTelemetry encoder (`opentelemetry.exporter.otlp.proto.common`) builds a protobuf message object
per attribute, value and span: ~85 us a span here, 80 % of a held-out round's trace work (docs/performance.md).
The wire format of the few shapes our spans have is small: this writes the same bytes' meaning field
by field (`opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto`, `resource/v1/resource.proto`),
and tests/test_traces.py holds its output, decoded, equal to that encoder's message.

Attribute values: str, bool, int, float, or a sequence of those (what OTel attributes may be).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_pack_q, _pack_d = struct.Struct("<Q").pack, struct.Struct("<d").pack


_SMALL = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, message); `tag` is field << 3 | 2, one byte below field 16."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _value(v) -> bytes:
    """AnyValue: string_value 1, bool_value 2, int_value 3, double_value 4, array_value 5 (ArrayValue.values 1)."""
    if isinstance(v, str):
        return _field(0x0A, v.encode())
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + _varint(v & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement as a varint
    if isinstance(v, float):
        return b"\x21" + _pack_d(v)
    if isinstance(v, (tuple, list)):
        return _field(0x2A, b"".join(_field(0x0A, _value(x)) for x in v))
    raise TypeError(f"an OTel attribute value cannot be {type(v).__name__}")


_KEYS: dict[str, bytes] = {}  # attribute key -> its encoded field: a fixed few dozen (our code names them), over and over


def _attributes(tag: int, attributes) -> bytes:
    """Repeated KeyValue (key 1, value 2) under field `tag`. The hot loop of a held-out round: a string
    value (most of them) is written inline."""
    out = []
    for k, v in (attributes or {}).items():
        key = _KEYS.get(k)
        if key is None:
            key = _KEYS[k] = _field(0x0A, k.encode())
        if type(v) is str:
            b = v.encode()
            value = b"\x0a" + _varint(len(b)) + b
        else:
            value = _value(v)
        kv = key + b"\x12" + _varint(len(value)) + value
        out.append(bytes((tag,)) + _varint(len(kv)) + kv)
    return b"".join(out)


def _span(sp) -> bytes:
    """Span: trace_id 1, span_id 2, parent_span_id 4, name 5, kind 6, start 7, end 8 (fixed64), attributes 9,
    status 15 (written even when unset, as the OTel encoder does), flags 16 (fixed32)."""
    c, parent = sp.context, sp.parent
    flags = 0x100 | (0x200 if parent is not None and parent.is_remote else 0)  # SPAN_FLAGS_CONTEXT_(HAS_)IS_REMOTE
    code, why = sp.status.status_code.value, sp.status.description  # Status: message 2, code 3
    status = (_field(0x12, why.encode()) if why else b"") + (b"\x18" + _varint(code) if code else b"")
    return b"".join((
        _field(0x0A, c.trace_id.to_bytes(16, "big")), _field(0x12, c.span_id.to_bytes(8, "big")),
        _field(0x22, parent.span_id.to_bytes(8, "big")) if parent is not None else b"",
        _field(0x2A, sp.name.encode()), b"\x30" + _varint(sp.kind.value + 1),  # SpanKind INTERNAL 0 -> proto 1
        b"\x39" + _pack_q(sp.start_time), b"\x41" + _pack_q(sp.end_time), _attributes(0x4A, sp.attributes),
        _field(0x7A, status), b"\x85\x01" + struct.pack("<I", flags),
    ))


def encode(spans: Sequence) -> bytes:
    """ExportTraceServiceRequest{resource_spans 1: ResourceSpans{resource 1: Resource{attributes 1},
    scope_spans 2: ScopeSpans{scope 1: InstrumentationScope{name 1, version 2, attributes 3}, spans 2}}},
    spans grouped by resource, then scope, in order of appearance. spans: finished ReadableSpans."""
    groups: dict = {}
    for sp in spans:
        groups.setdefault(sp.resource, {}).setdefault(sp.instrumentation_scope, []).append(_span(sp))
    out = []
    for resource, scopes in groups.items():
        body = [_field(0x0A, _attributes(0x0A, resource.attributes))]
        for scope, encoded in scopes.items():
            head = b"" if scope is None else (_field(0x0A, scope.name.encode()) +
                                              (_field(0x12, scope.version.encode()) if scope.version else b"") +
                                              _attributes(0x1A, scope.attributes))
            body.append(_field(0x12, _field(0x0A, head) + b"".join(_field(0x12, s) for s in encoded)))
        out.append(_field(0x0A, b"".join(body)))
    return b"".join(out)
