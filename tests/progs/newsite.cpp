// A C++ `new` call site: the innermost frame of the 4444-byte object is
// build_object (the user function calling new), not operator new.
struct Obj {
	char bytes[4444];
};

static Obj *volatile sink;

static __attribute__((noinline)) Obj *build_object() {
	return new Obj(); // NEW_SITE
}

int main() {
	sink = build_object(); // MAIN_SITE
	delete sink;
	return 0;
}
