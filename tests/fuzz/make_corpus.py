#!/usr/bin/env python3
"""Writes the seed corpus of the soft controller fuzz target into tests/fuzz/corpus/.

Input layout (see soft_controller_fuzz.hpp): mode byte, 64-byte SQE, descriptor-area bytes.
Words with bit 63 set are rebased into the mapped data region, bit 62 into the descriptor area.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REGION = 1 << 63
AREA = 1 << 62


def sqe(opcode, nsid=1, flags=0, prp1=0, prp2=0, cdw10=0, cdw11=0, cdw12=0, cdw13=0, sgl=None):
    head = struct.pack('<BBHIIIQ', opcode, flags, 0, nsid, 0, 0, 0)
    if sgl is not None:
        address, length, identifier = sgl
        dptr = struct.pack('<QI3xB', address, length, identifier)
    else:
        dptr = struct.pack('<QQ', prp1, prp2)
    return head + dptr + struct.pack('<6I', cdw10, cdw11, cdw12, cdw13, 0, 0)


def sgl_desc(kind, address, length):
    return struct.pack('<QI3xB', address, length, kind << 4)


def write(name, mode, command, area=b''):
    data = bytes([mode]) + command + area
    assert len(command) == 64
    with open(os.path.join(HERE, 'corpus', name), 'wb') as f:
        f.write(data)


def main():
    os.makedirs(os.path.join(HERE, 'corpus'), exist_ok=True)
    write('read_one_lba_prp1', 0, sqe(0x02, prp1=REGION))
    write('write_eight_lbas_prp_list', 0,
          sqe(0x01, prp1=REGION, prp2=AREA, cdw12=7),
          b''.join(struct.pack('<Q', REGION | (4096 * k)) for k in range(1, 8)))
    write('read_prp1_offset_prp2_page', 0, sqe(0x02, prp1=REGION | 0x200, prp2=REGION | 0x2000, cdw12=1, cdw10=3))
    write('read_sgl_data_block', 0, sqe(0x02, flags=0x40, cdw12=1, sgl=(REGION, 8192, 0x00)))
    write('write_sgl_last_segment', 0, sqe(0x01, flags=0x40, cdw12=1, sgl=(AREA, 32, 0x30)),
          sgl_desc(0, REGION | 0x100, 4096) + sgl_desc(0, REGION | 0x8000, 4096))
    write('read_sgl_segment_chain', 0, sqe(0x02, flags=0x40, cdw12=2, sgl=(AREA, 32, 0x20)),
          sgl_desc(0, REGION, 4096) + sgl_desc(3, AREA | 32, 32) + sgl_desc(0, REGION | 0x3000, 4096) + sgl_desc(0, REGION | 0x9000, 4096))
    write('sgl_segment_points_to_itself', 0, sqe(0x02, flags=0x40, sgl=(AREA, 16, 0x20)), sgl_desc(2, AREA, 16))
    write('prp1_not_dword_aligned', 0, sqe(0x02, prp1=REGION | 2))
    write('prp_list_entry_with_offset', 0, sqe(0x02, prp1=REGION, prp2=AREA, cdw12=3),
          struct.pack('<QQQ', REGION | 0x1000, REGION | 0x2010, REGION | 0x3000))
    write('prp_list_chain_loop', 0, sqe(0x02, prp1=REGION, prp2=AREA | (4096 - 8), cdw12=200),
          bytes(4096 - 8) + struct.pack('<Q', AREA | (4096 - 8)))
    write('unmapped_prp1', 0, sqe(0x02, prp1=0x1234000))
    write('lba_out_of_range', 0, sqe(0x02, prp1=REGION, cdw10=0xfffffff0))
    write('dataset_management_deallocate', 0, sqe(0x09, prp1=AREA, cdw10=0, cdw11=4), struct.pack('<IIQ', 0, 4, 16))
    write('flush', 0, sqe(0x00))
    write('write_zeroes', 0, sqe(0x08, cdw10=8, cdw12=3))
    write('unknown_opcode', 0, sqe(0x7d))
    write('invalid_namespace', 0, sqe(0x02, nsid=9, prp1=REGION))
    write('admin_identify_controller', 1, sqe(0x06, nsid=0, prp1=AREA, cdw10=1))
    write('admin_get_log_page_smart', 1, sqe(0x02, nsid=0xffffffff, prp1=AREA, cdw10=(127 << 16) | 2))
    write('admin_abort_unknown', 1, sqe(0x08, nsid=0, cdw10=(7 << 16) | 1))
    write('decoder_only_keyed_sgl', 2, sqe(0x02, flags=0x40, sgl=(AREA, 4096, 0x40)))


if __name__ == '__main__':
    main()
