/* Coroutine contexts for the CPU emulators of the GPU (emu_fa.c, emu_tc.c): each emulated GPU
 * thread runs on a stack of its own and yields to the scheduler at every barrier and warp
 * collective, millions of switches a row. glibc's swapcontext makes a sigprocmask system call
 * at each (half the emulator's time), so on x86-64 the switch is these few instructions instead:
 * the callee-saved registers, MXCSR and the x87 control word, the stack pointer. Under ASan (which
 * must see stack switches) and elsewhere: ucontext. */
#ifndef NB_OT_EMU_CTX_H
#define NB_OT_EMU_CTX_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define EMU_CTX_ASM 1
typedef struct {
    void *sp;
} emu_ctx;

/* emu_ctx_switch(save, to): saves the running context into *save and resumes to. */
void emu_ctx_switch(emu_ctx *save, const emu_ctx *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".weak emu_ctx_switch\n"
        ".type emu_ctx_switch, @function\n"
        "emu_ctx_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq (%rsi), %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n");

/* A context that starts fn (which must never return) on stack[0, size). */
static inline void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*fn)(void)) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *p = (uint64_t *)(top - 16); /* fn's return-address slot: fn starts as if called */
    p[0] = (uint64_t)(uintptr_t)fn;
    for (int i = 1; i <= 6; i++) p[-i] = 0; /* rbp rbx r12 r13 r14 r15 */
    uint32_t csr[2];
    __asm__ volatile("stmxcsr %0\n fnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
    p[-7] = (uint64_t)csr[0] | (uint64_t)(csr[1] & 0xffffu) << 32;
    c->sp = p - 7;
}
#else
#include <ucontext.h>
typedef struct {
    _Alignas(64) ucontext_t uc; /* swapcontext saves FPU state into it with aligned stores */
} emu_ctx;
static inline void emu_ctx_switch(emu_ctx *save, const emu_ctx *to) { swapcontext(&save->uc, &to->uc); }
static inline void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*fn)(void)) {
    if (getcontext(&c->uc) != 0) abort();
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL; /* fn never returns */
    makecontext(&c->uc, fn, 0);
}
#endif

#endif
