/* The buffer checks every C kernel of streambatch shares (one rule: what a buffer's format says it holds).
 *
 * A buffer is accepted as items of one kind when its struct format is exactly one format character, after at
 * most one native or standard byte-order prefix ('@', '=', or this machine's '<' / '>'); a NULL format means
 * 'B' (unsigned bytes), as the buffer protocol says.  Shipped with the sources (setup.py depends= and the
 * package data), so every kernel builds against the same rule.
 */
#ifndef STREAMBATCH_BUFFERS_H
#define STREAMBATCH_BUFFERS_H

#include <Python.h>
#include <string.h>

/* The format characters of a uint32 buffer: 'I', and 'L' where unsigned long is 4 bytes. */
#define SB_UINT32_KINDS (sizeof(unsigned long) == 4 ? "IL" : "I")

/* The one format character of *view* (see above), or 0 when its format is anything else. */
static inline char sb_format_char(const Py_buffer *view) {
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>')) {
        format++;
    }
    return (format[0] != '\0' && format[1] == '\0') ? format[0] : 0;
}

/* True when *view* holds items of *itemsize* bytes whose format character is one of *kinds*. */
static inline int sb_buffer_is(const Py_buffer *view, const char *kinds, Py_ssize_t itemsize) {
    char kind = sb_format_char(view);
    return kind != 0 && view->itemsize == itemsize && strchr(kinds, kind) != NULL;
}

#endif
