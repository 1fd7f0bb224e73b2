/* The entry point and memory functions of nsconfine's helpers: see freestanding.h. */
#include "freestanding.h"

/*
 * The kernel starts a program with its stack pointer at argc, followed by
 * the argv pointers, a NULL, the envp pointers and a NULL. _start hands that
 * address to start_c with the stack aligned as the C ABI wants.
 */
#if defined(__x86_64__)
__asm__(".text\n"
        ".global _start\n"
        ".type _start, @function\n"
        "_start:\n"
        "    xor %rbp, %rbp\n"
        "    mov %rsp, %rdi\n"
        "    and $-16, %rsp\n"
        "    call start_c\n"
        "    hlt\n");
#else
__asm__(".text\n"
        ".global _start\n"
        ".type _start, %function\n"
        "_start:\n"
        "    mov x29, #0\n"
        "    mov x30, #0\n"
        "    mov x0, sp\n"
        "    and x1, x0, #-16\n"
        "    mov sp, x1\n"
        "    bl start_c\n"
        "    brk #0\n");
#endif

__attribute__((noreturn, used)) void start_c(long *stack)
{
    int argc = (int)stack[0];
    char **argv = (char **)(stack + 1);
    char **envp = argv + argc + 1;
    sys_exit(helper_main(argc, argv, envp));
}

/* Plain byte loops: the helpers move little memory. (Built with
 * -fno-tree-loop-distribute-patterns, so the compiler does not turn these
 * loops back into calls to themselves.) */
void *memcpy(void *dest, const void *src, size_t n)
{
    unsigned char *d = dest;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dest;
}

void *memmove(void *dest, const void *src, size_t n)
{
    unsigned char *d = dest;
    const unsigned char *s = src;
    if (d < s) {
        while (n--)
            *d++ = *s++;
    } else {
        while (n--)
            d[n] = s[n];
    }
    return dest;
}

void *memset(void *dest, int c, size_t n)
{
    unsigned char *d = dest;
    while (n--)
        *d++ = (unsigned char)c;
    return dest;
}

int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++) {
        if (*x != *y)
            return *x - *y;
    }
    return 0;
}

size_t strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}
