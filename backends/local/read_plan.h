// Planning O_DIRECT reads of arbitrary ranges. Pure functions.
//
// O_DIRECT needs the file offset, the length and the destination address
// aligned (4096 here). A request [offset, offset+length) -> dst is cut into
// pieces that all read aligned file ranges:
//   - when dst and offset are congruent modulo the alignment, the aligned
//     middle is read straight into dst, and only the partial head and tail
//     blocks go through scratch ("bounce") buffers;
//   - otherwise the whole aligned enclosing range is read through bounce
//     buffers and the wanted bytes copied out.
// With align == 1 every piece is direct (buffered files).
#pragma once

#include <cstdint>
#include <vector>

namespace ckptio::local {

struct ReadPiece {
  uint32_t request = 0;      // index of the request the piece serves
  uint64_t file_offset = 0;  // aligned start of the read
  uint64_t length = 0;       // aligned bytes to read (may run past end of file)
  bool bounce = false;       // read into scratch, then copy
  uint64_t dst_offset = 0;   // where the wanted bytes land in the request's dst
  uint64_t copy_from = 0;    // bounce: offset of the first wanted byte in scratch
  uint64_t wanted = 0;       // bytes of the request this piece delivers
  // Bytes the read must return (the rest of a bounced tail block may lie past
  // end of file).
  uint64_t needed() const { return bounce ? copy_from + wanted : length; }
};

// Appends the pieces for one request to `out`. `align` is a power of two;
// `max_direct` and `max_bounce` (multiples of align) cap a piece's length.
void plan_read(uint32_t request, uint64_t offset, uint64_t length, uintptr_t dst, uint64_t align,
               uint64_t max_direct, uint64_t max_bounce, std::vector<ReadPiece>& out);

}  // namespace ckptio::local
