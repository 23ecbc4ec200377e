"""One flat array per Flower message (issue 12): packing loses nothing, FedAvg on the packed
model equals FedAvg on the separate tensors bit for bit, and unpacked input passes through."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedcure_app.flower.packing import is_packed, pack, unpack
from tests.simulation.fake_grid import task_identity

shapes_st = st.lists(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5),
                     min_size=2, max_size=6)


def _arrays(draw, shapes, dtype=np.float32):
    return [draw(hnp.arrays(dtype, s, elements=st.floats(-1e6, 1e6, width=32))) for s in shapes]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shapes=shapes_st)
def test_unpack_of_pack_gives_back_every_tensor_exactly(data, shapes):
    arrays = _arrays(data.draw, shapes)
    packed = pack(arrays)
    assert len(packed) == 1 and is_packed(packed, shapes)
    for a, b in zip(unpack(packed, shapes), arrays):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shapes=shapes_st, sizes=st.lists(st.integers(1, 1000), min_size=1,
                                                         max_size=5))
def test_fedavg_of_packed_replies_equals_fedavg_of_the_tensors_bit_for_bit(data, shapes, sizes):
    models = [_arrays(data.draw, shapes) for _ in sizes]

    def replies(packed: bool) -> list[Message]:  # called under task_identity()
        out = []
        for i, (arrays, n) in enumerate(zip(models, sizes)):
            content = RecordDict({"arrays": ArrayRecord(pack(arrays) if packed else arrays),
                                  "metrics": MetricRecord({"num-examples": n})})
            msg = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=i + 1,
                          message_type="train")
            out.append(Message(content, reply_to=msg))
        return out

    with task_identity():
        flat, _ = FedAvg().aggregate_train(1, replies(True))
        each, _ = FedAvg().aggregate_train(1, replies(False))
    assert flat is not None and each is not None
    for a, b in zip(unpack(flat.to_numpy_ndarrays(), shapes), each.to_numpy_ndarrays()):
        np.testing.assert_array_equal(a, b)


def test_what_cannot_or_need_not_be_packed_passes_through():
    one = [np.arange(4, dtype=np.float32)]
    assert pack(one)[0] is not None and len(pack(one)) == 1 and not is_packed(one, [(4,)])
    mixed = [np.zeros(2, np.float32), np.zeros(2, np.int64)]
    assert len(pack(mixed)) == 2
    separate = [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)]
    assert [a.shape for a in unpack(separate, [(2, 2), (3,)])] == [(2, 2), (3,)]
    with pytest.raises(ValueError, match="2 arrays"):
        unpack(separate, [(2, 2), (3,), (1,)])
    with pytest.raises(ValueError):
        unpack([np.zeros(6, np.float32)], [(2, 2), (3,)])  # 6 values for 7
