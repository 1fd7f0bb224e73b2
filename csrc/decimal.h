/*
 * Decimal text without snprintf, which is not async-signal-safe and which the
 * freestanding helpers do not have: shared by reaper.c (through
 * freestanding.h) and nsconfine.c (its forked children).
 */
#ifndef NSCONFINE_DECIMAL_H
#define NSCONFINE_DECIMAL_H

#include <stddef.h>

/* Decimal text of value into buf (at least 20 bytes, not terminated); its length. */
static inline size_t format_unsigned(char *buf, unsigned long value)
{
    char digits[20];
    size_t n = 0, out = 0;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value > 0);
    while (n > 0)
        buf[out++] = digits[--n];
    return out;
}

#endif
