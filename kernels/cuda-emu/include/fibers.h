// Fibers for the CUDA emulation (emu.h): a stack each, and the switch between them, so that a
// block's threads run on one OS thread and trade places only where one waits or ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <sys/mman.h>
#include <unistd.h>

// The switch between fibers in x86-64 assembly, or glibc's swapcontext (below).
#if defined(__x86_64__) && defined(__ELF__) && !defined(LAB_EMU_UCONTEXT)
#define LAB_EMU_SWITCH_IN_ASSEMBLY
#else
#include <ucontext.h>
#endif

namespace emu {
// Fibers at once: a block's threads (emu.h's max_threads).
constexpr unsigned max_fibers = 256;

// Where a fiber (or the scheduler) stopped, and the switch from one to another: on x86-64 ELF
// its stack pointer, with the callee-saved registers pushed on its stack (a call's worth of
// work; glibc's swapcontext, the fallback elsewhere, also sets the signal mask: a system
// call). The switch leaves MXCSR and the x87 control word alone (swapcontext keeps them per
// context), which nothing here changes; and its `ret` to another fiber's return address
// would fault under a CET shadow stack, which builds do not turn on by default. The symbol is
// weak, so that more than one translation unit may include this.
#ifdef LAB_EMU_SWITCH_IN_ASSEMBLY
struct Context {
    void* sp;
};
extern "C" void lab_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .pushsection .text
    .weak lab_emu_switch
    .type lab_emu_switch, @function
lab_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lab_emu_switch, .-lab_emu_switch
    .popsection
)");
inline void switch_context(Context& save, const Context& load) { lab_emu_switch(&save.sp, load.sp); }
// A context that starts `entry` (which must never return) on the stack [stack, stack + size):
// at its top the six registers lab_emu_switch pops (zeros), `entry` for its `ret`, and above
// that the slot of a return address, so that `entry` starts with the stack aligned as after a
// call.
inline void start_context(Context& c, void* stack, size_t size, void (*entry)()) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
    auto* sp = reinterpret_cast<uintptr_t*>(top);
    *--sp = 0;
    *--sp = reinterpret_cast<uintptr_t>(entry);
    for (int r = 0; r < 6; ++r) *--sp = 0;
    c.sp = sp;
}
#else
struct Context {
    ucontext_t uc;
};
inline void switch_context(Context& save, const Context& load) { swapcontext(&save.uc, &load.uc); }
inline void start_context(Context& c, void* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// Each fiber's stack, mapped once and kept for every block: 1 MiB (the kernels keep tiles in
// local arrays; a wmma fragment is 1 KiB here), under a page that faults on an overflow.
constexpr size_t stack_size = 1 << 20;
inline void* fiber_stack(unsigned t) {
    static void* stacks[max_fibers];
    if (!stacks[t]) {
        size_t page = size_t(sysconf(_SC_PAGESIZE));
        void* base = mmap(nullptr, page + stack_size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0) {
            std::perror("a fiber's stack");
            std::abort();
        }
        stacks[t] = static_cast<uint8_t*>(base) + page;
    }
    return stacks[t];
}

}  // namespace emu
