/* A shared object with one thread-local variable, preloaded (in as many
 * copies as needed) into valgrind runs only. libmemscope.so is a TLS module
 * (the Go runtime has TLS), and so is libunwind.so.8 when it loads it; glibc
 * sizes each thread's DTV -- a calloc counted in the heap totals -- by the
 * number of TLS modules, so it is 16 bytes larger per module per thread under
 * msmemscope. Preloading pads under valgrind gives both runs the same number
 * of TLS modules, hence identical heaps (tlsmods.c counts them). */
__thread int msmemscope_test_tls_pad;
