// Leak kinds with C++ containers: a global vector of strings and a map
// (still reachable, with their nodes and buffers), an object held through a
// second base class pointer (multipleinheritance heuristic), an array of
// objects with destructors held at its first element (newarray heuristic),
// a lost vector (the vector definitely lost, its buffer indirectly), a lost
// string, and a lost malloc(20) last.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>
struct A { virtual ~A() {} long a = 1; };
struct B { virtual ~B() {} long b = 2; };
struct C : A, B { long c = 3; };
struct D { ~D() {} long d = 4; };
static std::vector<std::string> *vec;
static std::map<int, std::string> *mp;
static B *base;
static D *arr;
int main() {
	vec = new std::vector<std::string>();
	for (int i = 0; i < 10; i++) vec->push_back(std::string(40 + i, 'x'));
	mp = new std::map<int, std::string>();
	for (int i = 0; i < 5; i++) (*mp)[i] = std::string(50, 'y');
	base = new C();
	arr = new D[5];
	auto *lost = new std::vector<int>(100);
	lost = nullptr;
	std::printf("%zu %zu\n", vec->size(), mp->size());
	new std::string(64, 'z');
	char *last = static_cast<char *>(std::malloc(20));
	last[0] = 0;
	return 0;
}
