"""A CUDA graph of a recorded call that replays on each call's own addresses.

:class:`AddressedGraph` holds the graph of a recorded call's launches
(:class:`~pasa_npu.fallback.kernel_common.PreparedCall`), captured once. Before a replay
for tensors that lie elsewhere, it rewrites, in the instantiated graph, the arguments of
each kernel node that hold the call's addresses: the pointers and the TMA maps over the
call's tensors and what is made from them (each map re-addressed by
``cuTensorMapReplaceAddress``; the node's arguments set by
``cuGraphExecKernelNodeSetParams``, which affects only later replays). Every other
argument is the capture's, as the recorded launches' are; the workspaces stay where the
graph holds them. A call then costs one graph launch and a driver call per kernel in place
of a launch per kernel.

Made only where every check holds: the driver has the calls, the graph holds one node per
recorded launch and no other work but what computes its workspaces, and each argument to
rewrite holds, in the captured node, the value the recorded launch passed there (which
checks the parameter positions and the CUtensorMap's place in Triton's descriptor
object)."""
from __future__ import annotations

import ctypes
import functools
import struct
from typing import Optional

import torch

_KERNEL_NODE = 0     # CU_GRAPH_NODE_TYPE_KERNEL
_MEMSET_NODE = 2     # CU_GRAPH_NODE_TYPE_MEMSET
_MAP_BYTES = 128     # sizeof(CUtensorMap)
_MAP_OFFSET = 128    # the map in Triton's PyCUtensorMap object: 128-byte aligned after its head
_SCRATCH_PARAMS = 2  # Triton's trailing global and profile scratch pointers


class _NodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2."""
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("kernel_params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


@functools.lru_cache(maxsize=None)
def _driver():
    """The driver calls used here, or None where the driver lacks one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        calls = dict(nodes=lib.cuGraphGetNodes, node_type=lib.cuGraphNodeGetType,
                     get=lib.cuGraphKernelNodeGetParams_v2, param_info=lib.cuFuncGetParamInfo,
                     set=lib.cuGraphExecKernelNodeSetParams_v2,
                     readdress=lib.cuTensorMapReplaceAddress, launch=lib.cuGraphLaunch)
    except (OSError, AttributeError):
        return None
    ptr, size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    calls["nodes"].argtypes = [ptr, ctypes.POINTER(ptr), size_p]
    calls["node_type"].argtypes = [ptr, ctypes.POINTER(ctypes.c_int)]
    calls["get"].argtypes = [ptr, ctypes.POINTER(_NodeParams)]
    calls["param_info"].argtypes = [ptr, ctypes.c_size_t, size_p, size_p]
    calls["set"].argtypes = [ptr, ptr, ptr]
    calls["readdress"].argtypes = [ptr, ptr]
    calls["launch"].argtypes = [ptr, ptr]
    return calls


class _Node:
    """One kernel node: its parameters as the graph holds them, in a buffer of ours, and
    where each of the call's addresses goes in that buffer."""

    __slots__ = ("handle", "params", "params_at", "buffer", "start", "array", "pointers",
                 "maps", "words", "reads", "last")

    def __init__(self, handle, params, buffer, start, array, pointers, maps):
        self.handle, self.params, self.buffer, self.start = handle, params, buffer, start
        self.params_at = ctypes.addressof(params)
        self.array = array  # the parameters' addresses (kept alive: params points to it)
        # (offset from start, role); AddressedGraph makes them (64-bit word, address index)
        # and (the map's address, address index)
        self.pointers, self.maps = pointers, maps
        self.words = self.reads = None  # set by AddressedGraph: the buffer as 64-bit words,
        # and the indices of the addresses the node reads
        self.last = None  # the addresses the node holds


class AddressedGraph:
    """The instantiated graph of a recorded call and, per kernel node, how to put another
    call's addresses into it (:meth:`make`, :meth:`replay`)."""

    __slots__ = ("graph", "exec", "nodes", "roles", "columns", "addresses", "device",
                 "_set", "_readdress", "_launch")

    def __init__(self, graph, nodes: list, roles: dict, names: tuple):
        self.graph, self.nodes = graph, nodes
        self.exec = graph.raw_cuda_graph_exec()
        calls = _driver()
        self._set, self._readdress, self._launch = calls["set"], calls["readdress"], calls["launch"]
        # the roles whose addresses the nodes take, each read once per call: tensors, then
        # descriptors (the address of their base)
        used = dict.fromkeys(role for node in nodes for _, role in (*node.pointers, *node.maps))
        tensors = tuple(r for r in used if isinstance(roles[r], torch.Tensor))
        self.roles = (*tensors, *(r for r in used if r not in tensors))
        # where each of them is among the call's own roles (``names``); None unless all are
        # the call's own tensors
        self.columns = (tuple(names.index(r) for r in self.roles)
                        if set(self.roles) <= set(names) and len(self.roles) == len(tensors)
                        else None)
        index = {role: i for i, role in enumerate(self.roles)}
        for node in nodes:
            pad = node.start - ctypes.addressof(node.buffer)
            whole = (len(node.buffer) - pad) // 8 * 8
            node.words = memoryview(node.buffer).cast("B")[pad:pad + whole].cast("Q")
            node.pointers = tuple((offset // 8, index[role]) for offset, role in node.pointers)
            node.maps = tuple((node.start + offset, index[role]) for offset, role in node.maps)
            node.reads = tuple(dict.fromkeys(i for _, i in (*node.pointers, *node.maps)))
        self.addresses = self.addresses_of(roles)  # those the graph holds
        self.device = next(t for t in roles.values() if isinstance(t, torch.Tensor)).get_device()

    @classmethod
    def make(cls, graph, launches: list, roles: dict, names: tuple,
             owned: frozenset = frozenset(), computes: bool = False) -> Optional["AddressedGraph"]:
        """``graph`` (captured with ``keep_graph=True`` on ``roles``, whose first roles are
        the call's own, ``names``, and instantiated), or None where a check fails (module docstring).
        ``launches``: the recorded call's launches, in order. ``owned``: the roles the graph
        holds itself (workspaces, and what it computes from them alone, ``computes``: in
        nodes of its own): their arguments are never rewritten."""
        calls = _driver()
        if calls is None or not launches or not all(launch.direct for launch in launches):
            return None
        try:
            found = _nodes(calls, ctypes.c_void_p(graph.raw_cuda_graph()))
        except (AttributeError, RuntimeError):
            return None
        if found is None:
            return None
        handles, memsets = found
        by_function = {}
        for handle in handles:
            params = _NodeParams()
            if calls["get"](handle, ctypes.byref(params)) != 0:
                return None
            by_function.setdefault(params.func, []).append((handle, params))
        nodes = []
        for launch in launches:
            found = by_function.pop(launch.compiled.function, [])
            if len(found) != 1:  # a kernel twice: its nodes cannot be told apart here
                return None
            node = _node(calls, launch, *found[0], roles, owned)
            if node is None:
                return None
            nodes.append(node)
        if not computes and (memsets or by_function):
            return None  # work in the graph that no recorded launch accounts for
        return cls(graph, nodes, roles, names)

    def addresses_of(self, roles: dict) -> list:
        """The addresses :meth:`replay` takes, read from ``roles`` (the call's tensors and
        what its steps derived from them)."""
        return [t.data_ptr() if isinstance(t, torch.Tensor) else t.base.data_ptr()
                for t in map(roles.__getitem__, self.roles)]

    def replay(self, addresses: list) -> None:
        """Replay the graph on ``addresses``, those of :attr:`roles` in order (a tensor's
        data pointer, a descriptor's base's): each node's addresses rewritten first where
        they changed."""
        if addresses != self.addresses:
            self.addresses = None  # until every node holds this call's addresses
            for node in self.nodes:
                mine = [addresses[i] for i in node.reads]
                if mine == node.last:
                    continue
                node.last = None
                words = node.words
                for word, i in node.pointers:
                    words[word] = addresses[i]
                for at, i in node.maps:
                    if self._readdress(at, addresses[i]) != 0:
                        raise RuntimeError("cuTensorMapReplaceAddress failed")
                if self._set(self.exec, node.handle, node.params_at) != 0:
                    raise RuntimeError("cuGraphExecKernelNodeSetParams failed")
                node.last = mine
            self.addresses = addresses
        # the driver's launch on the current stream (torch's replay costs more host time),
        # where this thread's current device is the graph's (the driver's current context)
        if (torch._C._cuda_getDevice() != self.device or self._launch(
                self.exec, torch._C._cuda_getCurrentRawStream(self.device)) != 0):
            self.graph.replay()


def _nodes(calls, graph) -> Optional[tuple]:
    """(the graph's kernel nodes, how many memset nodes it has), or None where it has a node
    of another kind."""
    count = ctypes.c_size_t(0)
    if calls["nodes"](graph, None, ctypes.byref(count)) != 0:
        return None
    handles = (ctypes.c_void_p * count.value)()
    if calls["nodes"](graph, handles, ctypes.byref(count)) != 0:
        return None
    kind = ctypes.c_int(-1)
    kernels, memsets = [], 0
    for handle in handles:
        if calls["node_type"](handle, ctypes.byref(kind)) != 0:
            return None
        if kind.value == _KERNEL_NODE:
            kernels.append(ctypes.c_void_p(handle))
        elif kind.value == _MEMSET_NODE:
            memsets += 1
        else:
            return None
    return kernels, memsets


def _param_layout(calls, function) -> list:
    """(offset, size) of each of ``function``'s parameters."""
    layout = []
    offset, size = ctypes.c_size_t(0), ctypes.c_size_t(0)
    while calls["param_info"](function, len(layout), ctypes.byref(offset),
                              ctypes.byref(size)) == 0:
        layout.append((offset.value, size.value))
    return layout


def _node(calls, launch, handle, params: _NodeParams, roles: dict,
          owned: frozenset) -> Optional[_Node]:
    """``launch``'s node (``handle``, its ``params`` as captured on ``roles``; the arguments
    of the ``owned`` roles left as captured), or None."""
    send = launch.send
    values = launch.bound(roles)
    lengths = [1] * len(values)
    for i, meta in zip(send.described, send.metas):
        if meta is None:
            return None  # a descriptor lowered to a pointer: not rewritten here
        lengths[i] = send.map_width(values[i])
    # each value's first position among the expanded values, and each position's parameter
    starts, position, parameter, param_of = [], 0, 0, {}
    for i, length in enumerate(lengths):
        starts.append(position)
        plain = i not in send.described
        for _ in range(length):
            if not (plain and send.kinds[i] == "constexpr"):
                param_of[position] = parameter
                parameter += 1
            position += 1
    layout = _param_layout(calls, params.func)
    if len(layout) != parameter + _SCRATCH_PARAMS or not params.kernel_params:
        return None
    expanded = send.expanded(list(values))
    captured = ctypes.cast(params.kernel_params, ctypes.POINTER(ctypes.c_void_p))
    # the parameters at their offsets from a 128-byte aligned start (the maps' alignment)
    buffer, pad = _aligned_buffer(max(offset + length for offset, length in layout))
    start = ctypes.addressof(buffer) + pad
    for index, (offset, length) in enumerate(layout):
        ctypes.memmove(start + offset, captured[index], length)
    pointers, maps = [], []
    for i, role in launch.addresses:
        offset, length = layout[param_of[starts[i]]]
        if (length != 8 or offset % 8 or struct.unpack_from("<Q", buffer, pad + offset)[0]
                != expanded[starts[i]]):
            return None
        if role not in owned:
            pointers.append((offset, role))
    lazy = {i: role for i, role, _ in launch.described}
    descriptors = {i: role for i, role in launch.slots if i in send.described}
    if len(descriptors) != len(launch.slots):
        return None  # a role in another kind of parameter
    for i, role in sorted({**lazy, **descriptors}.items()):
        offset, length = layout[param_of[starts[i]]]
        tensor_map = buffer.raw[pad + offset:pad + offset + length]
        if (length != _MAP_BYTES or tensor_map
                != ctypes.string_at(id(expanded[starts[i]]) + _MAP_OFFSET, _MAP_BYTES)):
            return None  # not the map the launch passed there
        address = (roles[role].base if i in descriptors else roles[role]).data_ptr()
        if not _readdresses_in_place(calls, tensor_map, address):
            return None
        if role not in owned:
            maps.append((offset, role))
    array = (ctypes.c_void_p * len(layout))(*[start + offset for offset, _ in layout])
    own = _NodeParams.from_buffer_copy(params)
    own.kernel_params = ctypes.addressof(array)
    own.extra = None
    return _Node(handle, own, buffer, start, array, tuple(pointers),
                 tuple(maps))


def _aligned_buffer(size: int) -> tuple:
    """(a ctypes buffer, the offset in it of ``size`` bytes that start 128-byte aligned)."""
    buffer = ctypes.create_string_buffer(size + _MAP_BYTES)
    return buffer, -ctypes.addressof(buffer) % _MAP_BYTES


def _readdresses_in_place(calls, tensor_map: bytes, address: int) -> bool:
    """Whether ``tensor_map``, re-addressed to ``address`` (its own), stays as it is."""
    copy, pad = _aligned_buffer(_MAP_BYTES)
    at = ctypes.addressof(copy) + pad
    ctypes.memmove(at, tensor_map, _MAP_BYTES)
    return (calls["readdress"](at, address) == 0
            and ctypes.string_at(at, _MAP_BYTES) == tensor_map)


def supported() -> bool:
    """Whether this process can rewrite graphs (a CUDA driver with the calls, a torch whose
    graphs expose their handles)."""
    return (_driver() is not None and hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"))
