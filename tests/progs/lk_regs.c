/* Leak kinds with threads still alive at exit, each holding its block's only
 * pointer in a register: one spins in user space (r12), one is blocked in a
 * system call (r13, pause). Registers of live threads are roots, as in
 * valgrind: both blocks are still reachable. A lost malloc(20) last
 * (definitely lost). The pointers reach the registers XORed through a
 * global, which is cleared by the same asm: no copy is left in memory (the
 * stack below is scrubbed of malloc's frames first). x86-64 only. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>

#define MASK 0x5555000000000000ull
static volatile uintptr_t hidden_spin, hidden_block;
static volatile int ready_spin, ready_block;

static __attribute__((noinline)) void scrub(void) {
	volatile uintptr_t buf[2048]; // no memset: its first call's lazy binding would save registers below
	for (int i = 0; i < 2048; i++) buf[i] = 0;
}

static void *spinner(void *a) {
	(void)a;
	hidden_spin = (uintptr_t)malloc(4242) ^ MASK;
	scrub();
	__asm__ volatile("movq %0, %%r12\n\t"
	                 "xorq %1, %%r12\n\t"
	                 "movq $0, %0\n\t"
	                 "movl $1, %2\n\t"
	                 "1: pause\n\t"
	                 "jmp 1b"
	                 : "+m"(hidden_spin), "+r"((uint64_t){MASK}), "=m"(ready_spin)
	                 :
	                 : "r12", "memory");
	return NULL;
}

static void *blocker(void *a) {
	(void)a;
	hidden_block = (uintptr_t)malloc(2424) ^ MASK;
	scrub();
	__asm__ volatile("movq %0, %%r13\n\t"
	                 "xorq %1, %%r13\n\t"
	                 "movq $0, %0\n\t"
	                 "movl $1, %2\n\t"
	                 "1: movl %3, %%eax\n\t"
	                 "syscall\n\t"
	                 "jmp 1b"
	                 : "+m"(hidden_block), "+r"((uint64_t){MASK}), "=m"(ready_block)
	                 : "i"(SYS_pause)
	                 : "r13", "rax", "rcx", "r11", "memory");
	return NULL;
}

static __attribute__((noinline)) void drop(void) {
	char *volatile last = malloc(20);
	last[0] = 0;
}

int main(void) {
	pthread_t t;
	pthread_create(&t, NULL, spinner, NULL);
	pthread_create(&t, NULL, blocker, NULL);
	while (!ready_spin || !ready_block) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	drop();
	return 0;
}
