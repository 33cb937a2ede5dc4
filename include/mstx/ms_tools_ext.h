/* mstx marking API (SPEC §1.3), exported by libmemscope.so.
 * A range whose message is exactly "step start" delimits a step (SPEC §3). */
#ifndef MS_TOOLS_EXT_H
#define MS_TOOLS_EXT_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Records an instantaneous mark. stream is accepted for compatibility and ignored. */
void mstxMarkA(const char *msg, void *stream);
/* Opens a range and returns its id (0 if nothing could be recorded). */
uint64_t mstxRangeStartA(const char *msg, void *stream);
/* Closes the range opened with that id. */
void mstxRangeEnd(uint64_t id);

#ifdef __cplusplus
}
#endif
#endif
