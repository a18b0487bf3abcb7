"""A Python program that allocates device memory through ctypes, as a
framework's extension would, for `tidepool run --pool` (interposer_check's
Pool.ServesAPythonProgram): libcuda.so.1 is the fake driver of tests/preload.
It writes a pattern into each block, reads them back, double-frees one, and
prints "name value..." lines."""
import ctypes

MiB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
cuda.fake_cuda_used_bytes.restype = ctypes.c_size_t

print("init", cuda.cuInit(0), flush=True)
sizes = [(i % 3 + 1) * MiB + i * 4096 for i in range(8)]
blocks = []
status = 0
for size in sizes:
    pointer = ctypes.c_ulonglong(0)
    status |= cuda.cuMemAlloc_v2(ctypes.byref(pointer), size)
    blocks.append(pointer.value)
print("alloc", status)
for i, (block, size) in enumerate(zip(blocks, sizes)):
    ctypes.memset(block, 0x30 + i, size)
intact = all(ctypes.string_at(block, size) == bytes([0x30 + i]) * size
             for i, (block, size) in enumerate(zip(blocks, sizes)))
print("intact", int(intact))
print("live", sum(sizes))
print("physical", cuda.fake_cuda_used_bytes())
first = cuda.cuMemFree_v2(blocks[0])
print("double_free", first, cuda.cuMemFree_v2(blocks[0]))
for block in blocks[1:]:
    cuda.cuMemFree_v2(block)
