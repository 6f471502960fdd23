"""Warming L2 with a tensor that a later kernel reads: bulk prefetches issued from inside a kernel whose own
memory traffic leaves DRAM idle (decode attention at small batches), so that the next kernel (the o
projection of one decode row, 32 MB on Llama-3-8B) reads its weights from L2 instead of DRAM.

`cp.async.bulk.prefetch.L2` (sm_90+) hands a whole chunk to the copy engine with one instruction and no
destination register: a program issues its share and goes on with its own work at once.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Bytes one prefetch instruction covers; the chunks are spread over the launching grid's programs.
L2_PREFETCH_CHUNK = tl.constexpr(64 * 1024)


@triton.jit
def prefetch_to_l2(base_ptr, num_bytes, program, num_programs, CHUNK: tl.constexpr):
    """Program `program` of `num_programs` asks L2 for its chunks of the num_bytes at base_ptr (a
    16-byte-aligned byte pointer, num_bytes a multiple of 16), one instruction per chunk from one thread."""
    for start in range(program * CHUNK, num_bytes, num_programs * CHUNK):
        size = tl.minimum(num_bytes - start, CHUNK)
        tl.inline_asm_elementwise(
            """{
            .reg .pred first;
            .reg .b32 tid;
            mov.u32 tid, %tid.x;
            setp.eq.u32 first, tid, 0;
            @first cp.async.bulk.prefetch.L2.global [$1], $2;
            mov.u32 $0, 0;
            }""",
            "=r,l,r", [base_ptr + start, size], dtype=tl.int32, is_pure=False, pack=1)
