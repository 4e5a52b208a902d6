"""Our tinker_public.proto is the SDK's schema: same serialized descriptor, so the same bytes."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from tinker.proto import tinker_public_pb2 as sdk_pb

from tx.api.wire import tinker_public_pb2 as pb


def _file_proto(module) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def test_descriptor_matches_the_sdk():
    ours = _file_proto(pb)
    assert ours.name == "tinker_public.proto" and ours.package == "tinker_public"
    assert ours == _file_proto(sdk_pb)


def test_generated_module_matches_the_checked_in_proto_source():
    """The serialized descriptor inside tinker_public_pb2.py is byte-identical to the SDK's."""
    src = (Path(pb.__file__)).read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", src, re.S)
    assert match, "generated module layout changed"
    ours = descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))
    assert ours == _file_proto(sdk_pb)


def test_module_imports_cleanly_before_the_sdk():
    code = (
        "import warnings; warnings.simplefilter('error');"
        "import tx.api.wire.tinker_public_pb2 as ours;"
        "from tinker.proto import tinker_public_pb2 as sdk;"
        "assert ours.SampleResponse.DESCRIPTOR.full_name == 'tinker_public.SampleResponse'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_field_numbers_of_the_hot_messages():
    fields = {f.name: f.number for f in pb.ForwardBackwardRequest.DESCRIPTOR.fields}
    assert fields == {
        "model_id": 1,
        "seq_id": 2,
        "data": 3,
        "loss_fn": 4,
        "loss_fn_config": 5,
        "forward_only": 6,
        "loss_fn_config_v2": 7,
    }
    bt = {f.name: f.number for f in pb.BatchedTensor.DESCRIPTOR.fields}
    assert bt == {"data": 1, "offsets": 2, "dtype": 3, "trailing_shape": 4}
