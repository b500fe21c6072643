"""The protobuf messages of an Nsight Compute ``.ncu-rep`` report, as far as the reader needs them.

Field numbers come from the message descriptions Nsight Compute ships (``ProfilerReport.proto``,
``ProfilerSection.proto``, ``RuleResults.proto``, ``ProfilerCommon.proto``, ...; public copies
exist in tools that read these reports) and were checked one by one against the real reports
in shared/traces/ncu-rep (Nsight Compute 2023.1, 2024.1, 2024.2, 2025.1). Fields marked
"seen" are in those reports but not in the public descriptions; their meaning was read off
the real files (the rule-result speed-up against the same program's console report).

Everything is declared ``optional`` (proto2) and strings as ``bytes``, so that a damaged
report decodes to what it holds, never fails on a missing required field or bad UTF-8;
the reader checks what it needs. Fields not declared here are kept by protobuf as unknown
fields; `KNOWN_FIELDS` lists every field number the descriptions or the real reports
have, so that the reader can warn about the others (a newer Nsight Compute).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_TYPES = {
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

# message -> (field name, number, type or message name, repeated?)
MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "FileHeader": [("Version", 1, "uint32", False)],
    "StringTable": [("Strings", 1, "bytes", True)],
    "ProcessInfo": [("ProcessID", 1, "uint32", False), ("Hostname", 2, "bytes", False),
                    ("ProcessName", 3, "bytes", False)],
    "SystemInfo": [("OSName", 1, "bytes", False), ("Build", 2, "bytes", False),
                   ("Processor", 3, "bytes", False), ("Architecture", 4, "bytes", False),
                   ("ComputerName", 5, "bytes", False)],
    "VersionInfo": [("Provider", 1, "bytes", False), ("Version", 2, "bytes", False)],
    # A metric value holds one of these; a metric with instances lists them as well.
    "MetricValue": [("StringValue", 1, "bytes", False), ("FloatValue", 2, "float", False),
                    ("DoubleValue", 3, "double", False), ("Uint32Value", 4, "uint32", False),
                    ("Uint64Value", 5, "uint64", False)],
    "MetricListElement": [("CorrelationId", 1, "MetricValue", False),
                          ("ElementValue", 2, "MetricValue", False)],
    "MetricResult": [("NameId", 1, "uint32", False), ("MetricValue", 2, "MetricValue", False),
                     ("MetricValueList", 3, "MetricListElement", True)],
    "DeviceAttribute": [("Name", 1, "bytes", False), ("Value", 2, "MetricValue", False)],
    "DeviceAttributes": [("ID", 1, "uint32", False), ("Name", 2, "bytes", False),
                         ("Attributes", 3, "DeviceAttribute", True)],
    "SessionDetails": [("ProcessID", 1, "uint32", False), ("CreationTime", 2, "uint64", False),
                       ("HostSystemInfo", 3, "SystemInfo", False),
                       ("TargetSystemInfo", 4, "SystemInfo", False),
                       ("DeviceAttributes", 6, "DeviceAttributes", True),
                       ("VersionInfo", 8, "VersionInfo", True)],
    "BlockHeader": [("NumSources", 1, "uint32", False), ("NumResults", 2, "uint32", False),
                    ("SessionDetails", 3, "SessionDetails", False),
                    ("StringTable", 4, "StringTable", False), ("PayloadSize", 5, "uint32", False),
                    ("Process", 6, "ProcessInfo", False)],
    "Uint64x3": [("X", 1, "uint64", False), ("Y", 2, "uint64", False), ("Z", 3, "uint64", False)],
    "SectionMetric": [("Name", 1, "bytes", False), ("Label", 2, "bytes", False)],
    "SectionHeader": [("Metrics", 2, "SectionMetric", True)],
    "SectionMetrics": [("Metrics", 1, "SectionMetric", True)],
    "Section": [("Identifier", 1, "bytes", False), ("DisplayName", 2, "bytes", False),
                ("Header", 4, "SectionHeader", False), ("Metrics", 6, "SectionMetrics", False)],
    # Type: 0 none, 1 ok (shown as INF), 2 warning, 3 error, 4 optimization (seen).
    "RuleMessage": [("Message", 1, "bytes", False), ("Type", 2, "uint32", False),
                    ("Title", 4, "bytes", False)],
    # Seen: 1 = local, 2 = global (as the console report prints "Est. Local Speedup" / "Est. Speedup").
    "RuleSpeedup": [("Type", 1, "uint32", False), ("Value", 2, "double", False)],
    "RuleBodyItem": [("Message", 1, "RuleMessage", False), ("Speedup", 10, "RuleSpeedup", False)],
    "RuleBody": [("Items", 1, "RuleBodyItem", True)],
    "RuleResult": [("Identifier", 1, "bytes", False), ("DisplayName", 2, "bytes", False),
                   ("Body", 3, "RuleBody", False), ("SectionIdentifier", 4, "bytes", False)],
    # Grid in blocks and block in threads: GlobalWorkSize (32768, 1, 1) with LocalWorkSize
    # (512, 1, 1) is the launch the CSV of the same program writes as (32768, 1, 1)x(512, 1, 1).
    "ProfileResult": [("ThreadID", 1, "uint32", False), ("APICallID", 2, "uint64", False),
                      ("KernelID", 4, "uint64", False), ("KernelMangledName", 5, "bytes", False),
                      ("KernelFunctionName", 6, "bytes", False),
                      ("KernelDemangledName", 7, "bytes", False),
                      ("GlobalWorkSize", 10, "Uint64x3", False),
                      ("LocalWorkSize", 11, "Uint64x3", False),
                      ("MetricResults", 13, "MetricResult", True),
                      ("CreationTime", 14, "uint64", False),
                      ("Sections", 17, "Section", True), ("RuleResults", 19, "RuleResult", True),
                      ("ContextID", 22, "uint32", False), ("StreamID", 23, "uint32", False)],
}

# Every field number of the public descriptions plus those seen in real reports, for the
# messages whose unknown fields the reader looks at.
KNOWN_FIELDS: dict[str, frozenset[int]] = {
    "BlockHeader": frozenset(range(1, 7)),
    "SessionDetails": frozenset(range(1, 12)),  # 11: seen, not read
    "ProfileResult": frozenset(range(1, 26)),  # 25: seen, not read
    "MetricValue": frozenset(range(1, 6)),
}


def message_classes(messages: dict[str, list[tuple[str, int, str, bool]]], package: str) -> dict[str, type]:
    """Message classes for declarations shaped like `MESSAGES`, in a descriptor pool of their
    own (no clash with any other protobuf schema loaded in the process)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto2")
    for name, fields in messages.items():
        msg = fdp.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            f = msg.field.add(name=field_name, number=number, label=_REPEATED if repeated else _OPTIONAL)
            if kind in _TYPES:
                f.type = _TYPES[kind]
            else:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                f.type_name = f".{package}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    file = pool.FindFileByName(fdp.name)
    return {name: message_factory.GetMessageClass(file.message_types_by_name[name]) for name in messages}


CLASSES = message_classes(MESSAGES, "traceanalyzer_ncu_rep")
FileHeader = CLASSES["FileHeader"]
BlockHeader = CLASSES["BlockHeader"]
ProfileResult = CLASSES["ProfileResult"]
