// C++ new/delete (scalar, array, aligned, nothrow) and a std::vector and
// std::string on the heap. libstdc++ itself allocates 72,704 bytes (its
// emergency exception pool) before any constructor runs: both tools must see
// it. No iostream.
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

struct Node {
	Node *next;
	long payload[5];
};

struct alignas(64) Wide {
	char bytes[200];
};

static void *volatile sink;

int main() {
	Node *head = nullptr;
	for (int i = 0; i < 100; i++) {
		Node *n = new Node();
		n->next = head;
		head = n;
	}
	for (int i = 0; i < 90; i++) { // 10 nodes stay
		Node *n = head;
		head = head->next;
		delete n;
	}
	int *arr = new int[1000];
	sink = arr;
	delete[] arr;
	Wide *w = new Wide();
	sink = w;
	delete w;
	double *d = new (std::nothrow) double[33];
	sink = d; // kept
	std::vector<long> v;
	for (long i = 0; i < 5000; i++) v.push_back(i); // grows by reallocation
	std::string *s = new std::string(300, 'x');
	sink = s;
	delete s;
	sink = head;
	return 0;
}
