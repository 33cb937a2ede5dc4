// A C++ library that a C program loads with dlopen after start-up (as
// Python loads torch): libstdc++ comes with it, after msmemscope noted the
// modules its allocator wrappers live in.
struct Obj {
	char bytes[4444];
};

static __attribute__((noinline)) Obj *build_late() {
	return new Obj(); // LATE_NEW
}

extern "C" void *make_object() {
	return build_late(); // LATE_CALL
}

extern "C" void drop_object(void *o) {
	delete static_cast<Obj *>(o);
}
