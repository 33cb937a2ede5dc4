// Package symbolize turns raw return addresses captured in a traced Linux
// process into human-readable frames, offline, from the text of that
// process's /proc/self/maps and the ELF files it names.
//
// Each address becomes exactly one of (SPEC §2.1):
//
//	function file:line (module)   DWARF line information covers the address
//	function (module+0xoffset)    only a symbol table covers it
//	?? (module+0xoffset)          a file-backed mapping, but no symbol
//	0x<addr>                      no (named) mapping covers it
//
// module is the base name of the mapped file; file is the base name of the
// source file recorded in DWARF. offset is the address relative to the
// module's load bias, i.e. the ELF virtual address that addr2line or
// llvm-symbolizer expect (for PIE executables and shared objects built by
// GNU ld this equals the file offset); when the ELF file cannot be read it
// is the file offset (addr − mapping start + mapping offset). The offset is
// that of the address as given, not of addr−1.
//
// Addresses are treated as return addresses: symbol and line look-ups use
// addr−1 so that the call site, not the following instruction, is reported.
//
// Nothing here fails: vanished, unreadable or corrupt files, [vdso], [heap]
// and anonymous mappings all degrade to the formats above.
package symbolize

import (
	"bytes"
	"debug/dwarf"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/ianlancetaylor/demangle"
)

// mapping is one line of /proc/<pid>/maps.
type mapping struct {
	start, end uint64
	offset     uint64
	exec       bool
	path       string // as written in maps, " (deleted)" removed
	deleted    bool
	mod        *module // nil for anonymous mappings
}

// Symbolizer resolves return addresses of one traced process. It is safe
// for concurrent use.
type Symbolizer struct {
	mu      sync.Mutex
	maps    []*mapping // sorted by start
	modules map[string]*module
	cache   map[uint64]string
}

// New parses the text of /proc/<pid>/maps. Lines it cannot parse are
// skipped; ELF files are opened lazily on first use.
func New(maps string) *Symbolizer {
	s := &Symbolizer{modules: map[string]*module{}, cache: map[uint64]string{}}
	for _, line := range strings.Split(maps, "\n") {
		m := parseMapsLine(line)
		if m == nil {
			continue
		}
		if m.path != "" {
			mod := s.modules[m.path]
			if mod == nil {
				mod = &module{path: m.path, name: moduleName(m.path), deleted: m.deleted}
				s.modules[m.path] = mod
			}
			m.mod = mod
		}
		s.maps = append(s.maps, m)
	}
	sort.SliceStable(s.maps, func(i, j int) bool { return s.maps[i].start < s.maps[j].start })
	return s
}

// MapsLine is one line of /proc/<pid>/maps.
type MapsLine struct {
	Lo, Hi, Offset uint64
	Perms          string // "rw-p"
	Path           string // "" for anonymous memory, "[stack]", a file
	Deleted        bool   // the file was deleted (" (deleted)" cut from Path)
}

// ParseMapsLine parses one line of /proc/<pid>/maps: start-end perms
// offset dev inode [path], the path possibly holding spaces.
func ParseMapsLine(line string) (MapsLine, bool) {
	rest := strings.TrimSpace(line)
	var f [5]string
	for i := range f {
		rest = strings.TrimLeft(rest, " \t")
		j := strings.IndexAny(rest, " \t")
		if j < 0 {
			f[i], rest = rest, ""
		} else {
			f[i], rest = rest[:j], rest[j:]
		}
		if f[i] == "" {
			return MapsLine{}, false
		}
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return MapsLine{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(f[2], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil || end <= start || len(f[1]) < 3 {
		return MapsLine{}, false
	}
	m := MapsLine{Lo: start, Hi: end, Offset: off, Perms: f[1], Path: strings.TrimSpace(rest)}
	m.Path, m.Deleted = strings.CutSuffix(m.Path, " (deleted)")
	return m, true
}

func parseMapsLine(line string) *mapping {
	l, ok := ParseMapsLine(line)
	if !ok {
		return nil
	}
	return &mapping{start: l.Lo, end: l.Hi, offset: l.Offset, exec: l.Perms[2] == 'x', path: l.Path, deleted: l.Deleted}
}

func moduleName(path string) string {
	if strings.HasPrefix(path, "[") {
		return path // [vdso], [heap], [stack], [anon:...]
	}
	return filepath.Base(path)
}

// find returns the mapping containing addr, or nil.
func (s *Symbolizer) find(addr uint64) *mapping {
	i := sort.Search(len(s.maps), func(i int) bool { return s.maps[i].start > addr })
	if i == 0 {
		return nil
	}
	m := s.maps[i-1]
	if addr >= m.end {
		return nil
	}
	return m
}

// Module returns the base name of the mapped file that contains addr
// ("[vdso]" and the like for special mappings), or "" if no named mapping
// covers it.
func (s *Symbolizer) Module(addr uint64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.find(addr); m != nil && m.mod != nil {
		return m.mod.name
	}
	return ""
}

// InModule reports whether addr lies in a mapping of a file whose base name
// is moduleBase (e.g. "libmemscope.so"). A moduleBase ending in "*" matches
// by prefix ("libc.so*" matches "libc.so.6").
func (s *Symbolizer) InModule(addr uint64, moduleBase string) bool {
	name := s.Module(addr)
	if name == "" {
		return false
	}
	if p, ok := strings.CutSuffix(moduleBase, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return name == moduleBase
}

// Frames symbolizes a stack's return addresses, innermost first (see
// Frame), up to the first that cannot be one: inside a mapping that holds
// no code ([stack], [heap], data), or in none and below every mapping or,
// on x86-64, beyond the user address space. A frame-pointer walk that went
// through code built without frame pointers read such words as frames;
// what follows them is no more the stack's.
func (s *Symbolizer) Frames(addrs []uint64) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if !s.mayBeCode(a) {
			break
		}
		out = append(out, s.cached(a))
	}
	return out
}

// userTop bounds the x86-64 user address space (4-level paging: 47 bits).
const userTop = 1 << 47

// mayBeCode reports whether addr can be a return address: not in a mapping
// without execute permission; an address no mapping holds may be code
// unloaded before the maps were read, unless it lies below them all (small
// numbers) or above what x86-64 gives a process. s.mu is held.
func (s *Symbolizer) mayBeCode(addr uint64) bool {
	if m := s.find(addr); m != nil {
		return m.exec
	}
	if len(s.maps) > 0 && addr < s.maps[0].start {
		return false
	}
	return runtime.GOARCH != "amd64" || addr < userTop
}

// Frame symbolizes one return address.
func (s *Symbolizer) Frame(addr uint64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cached(addr)
}

// cached is Frame with s.mu held.
func (s *Symbolizer) cached(addr uint64) string {
	if f, ok := s.cache[addr]; ok {
		return f
	}
	f := s.frame(addr)
	s.cache[addr] = f
	return f
}

func (s *Symbolizer) frame(addr uint64) string {
	m := s.find(addr)
	if m == nil || m.mod == nil {
		return fmt.Sprintf("0x%x", addr)
	}
	mod := m.mod
	fileOff := addr - m.start + m.offset
	mod.load()
	vaddr, ok := mod.vaddr(addr, m)
	if !ok {
		return fmt.Sprintf("?? (%s+0x%x)", mod.name, fileOff)
	}
	fn, file, line := mod.lookup(vaddr - 1)
	fn = demangle.Filter(fn) // C++ and Rust names as people read them (DWARF names are plain already)
	switch {
	case fn != "" && file != "" && line > 0:
		return fmt.Sprintf("%s %s:%d (%s)", fn, file, line, mod.name)
	case fn != "":
		return fmt.Sprintf("%s (%s+0x%x)", fn, mod.name, vaddr)
	default:
		return fmt.Sprintf("?? (%s+0x%x)", mod.name, vaddr)
	}
}

// Close drops the cached ELF data. The Symbolizer keeps working afterwards
// but re-reads files on demand.
func (s *Symbolizer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, mod := range s.modules {
		*mod = module{path: mod.path, name: mod.name, deleted: mod.deleted}
	}
}

// ---------------------------------------------------------------------------
// modules

type symbol struct {
	addr, end uint64 // end: addr+size, or the section end when unsized
	sized     bool
	name      string
}

type module struct {
	path     string
	name     string
	deleted  bool
	loaded   bool
	*elfData // set by load; shared between Symbolizers while KeepModules holds
}

// elfData is what load reads of a module's file.
type elfData struct {
	mu     sync.Mutex // lookup parses DWARF units lazily, and may mark it broken
	ok     bool       // ELF headers read; vaddr translation possible
	broken bool       // a panic occurred while reading symbols/DWARF
	etExec bool
	loads  []elf.ProgHeader
	syms   []symbol
	dw     *dwarfIndex
}

// kept holds the modules read while KeepModules is in force, by file
// identity: the processes of one run share their libc, their interpreter
// and often their program, whose symbols and DWARF index are read once.
var kept struct {
	sync.Mutex
	holds int
	mods  map[fileID]*elfData
}

type fileID struct {
	dev, ino    uint64
	size, mtime int64
}

// KeepModules makes every Symbolizer share the modules read (same file:
// same device, inode, size and modification time) until release is
// called: the CLI converting the processes of a run reads libc once, not
// once a process.
func KeepModules() (release func()) {
	kept.Lock()
	defer kept.Unlock()
	if kept.holds++; kept.mods == nil {
		kept.mods = map[fileID]*elfData{}
	}
	return func() {
		kept.Lock()
		defer kept.Unlock()
		if kept.holds--; kept.holds == 0 {
			kept.mods = nil
		}
	}
}

func identify(path string) (fileID, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), st.Ino, fi.Size(), fi.ModTime().UnixNano()}, true
}

// load reads the module's file once (or takes what KeepModules kept of it).
func (mod *module) load() {
	if mod.loaded {
		return
	}
	mod.loaded = true
	mod.elfData = &elfData{}
	if mod.deleted || strings.HasPrefix(mod.path, "[") || !filepath.IsAbs(mod.path) {
		return
	}
	kept.Lock()
	keeping := kept.mods != nil
	kept.Unlock()
	if !keeping {
		mod.elfData.read(mod.path)
		return
	}
	id, ok := identify(mod.path)
	kept.Lock()
	if d := kept.mods[id]; ok && d != nil {
		mod.elfData = d
		kept.Unlock()
		return
	}
	kept.Unlock()
	mod.elfData.read(mod.path)
	kept.Lock()
	if ok && kept.mods != nil {
		kept.mods[id] = mod.elfData
	}
	kept.Unlock()
}

// read opens the ELF file and reads program headers, symbol tables and the
// DWARF unit index. It never panics.
func (mod *elfData) read(path string) {
	defer func() {
		if recover() != nil {
			mod.syms, mod.dw = nil, nil
			mod.broken = true
		}
	}()
	f, err := elf.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			mod.loads = append(mod.loads, p.ProgHeader)
		}
	}
	if len(mod.loads) == 0 {
		return
	}
	mod.etExec = f.Type == elf.ET_EXEC
	mod.ok = true

	var syms []symbol
	syms = appendFuncSymbols(syms, f, false)
	syms = appendFuncSymbols(syms, f, true)
	d, _ := f.DWARF()

	// Separate debug info (/usr/lib/debug, .gnu_debuglink) when the file
	// itself lacks DWARF or a full symbol table.
	if d == nil || !hasSection(f, ".symtab") {
		if df := openDebugFile(f, path); df != nil {
			defer df.Close()
			if d == nil {
				d, _ = df.DWARF()
			}
			if !hasSection(f, ".symtab") {
				syms = appendFuncSymbols(syms, df, false)
			}
		}
	}
	mod.syms = finishSymbols(syms)
	if d != nil {
		mod.dw = newDwarfIndex(d)
	}
}

// vaddr translates a runtime address in mapping m to the ELF virtual address.
func (mod *module) vaddr(addr uint64, m *mapping) (uint64, bool) {
	if !mod.ok {
		return 0, false
	}
	if mod.etExec {
		return addr, true
	}
	fileOff := addr - m.start + m.offset
	var best *elf.ProgHeader
	for i := range mod.loads {
		p := &mod.loads[i]
		if fileOff >= p.Off && fileOff-p.Off < max(p.Filesz, 1) {
			best = p
			break
		}
	}
	if best == nil {
		// Not inside any segment's file bytes (e.g. the page-alignment
		// slack of a mapping): use the last segment starting at or below.
		for i := range mod.loads {
			p := &mod.loads[i]
			if p.Off&^(max(p.Align, 1)-1) <= fileOff && (best == nil || p.Off > best.Off) {
				best = p
			}
		}
		if best == nil {
			return 0, false
		}
	}
	return fileOff - best.Off + best.Vaddr, true
}

// lookup returns function, source file base name and line for pc (an ELF
// virtual address). Any may be empty/zero.
func (mod *module) lookup(pc uint64) (fn, file string, line int) {
	mod.mu.Lock()
	defer mod.mu.Unlock()
	if mod.broken {
		return "", "", 0
	}
	defer func() {
		if recover() != nil {
			mod.broken = true
			fn, file, line = "", "", 0
		}
	}()
	if mod.dw != nil {
		fn, file, line = mod.dw.lookup(pc)
	}
	if fn == "" {
		fn = lookupSymbol(mod.syms, pc)
	}
	return fn, file, line
}

func hasSection(f *elf.File, name string) bool {
	s := f.Section(name)
	return s != nil && s.Type != elf.SHT_NOBITS
}

// ---------------------------------------------------------------------------
// symbol tables

func appendFuncSymbols(out []symbol, f *elf.File, dynamic bool) []symbol {
	var syms []elf.Symbol
	var err error
	if dynamic {
		syms, err = f.DynamicSymbols()
	} else {
		syms, err = f.Symbols()
	}
	if err != nil {
		return out
	}
	for _, sy := range syms {
		t := elf.ST_TYPE(sy.Info)
		if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || sy.Value == 0 || sy.Name == "" ||
			sy.Section == elf.SHN_UNDEF || sy.Section >= elf.SHN_LORESERVE {
			continue
		}
		sym := symbol{addr: sy.Value, end: sy.Value + sy.Size, sized: sy.Size > 0, name: sy.Name}
		if !sym.sized {
			// Bounded by its section here, by the next symbol in finishSymbols.
			sym.end = ^uint64(0)
			if int(sy.Section) < len(f.Sections) {
				if sec := f.Sections[sy.Section]; sy.Value >= sec.Addr && sy.Value < sec.Addr+sec.Size {
					sym.end = sec.Addr + sec.Size
				}
			}
		}
		out = append(out, sym)
	}
	return out
}

// finishSymbols sorts, de-duplicates (first seen wins: .symtab before
// .dynsym; sized before unsized) and bounds unsized symbols by the next one.
func finishSymbols(syms []symbol) []symbol {
	sort.SliceStable(syms, func(i, j int) bool {
		if syms[i].addr != syms[j].addr {
			return syms[i].addr < syms[j].addr
		}
		return syms[i].sized && !syms[j].sized
	})
	out := syms[:0]
	for _, sy := range syms {
		if len(out) > 0 && out[len(out)-1].addr == sy.addr {
			continue
		}
		out = append(out, sy)
	}
	for i := range out {
		if !out[i].sized && i+1 < len(out) && out[i+1].addr < out[i].end {
			out[i].end = out[i+1].addr
		}
	}
	return out
}

func lookupSymbol(syms []symbol, pc uint64) string {
	i := sort.Search(len(syms), func(i int) bool { return syms[i].addr > pc })
	// Walk back a little: a large sized symbol may enclose smaller ones.
	for j := i - 1; j >= 0 && j >= i-8; j-- {
		if pc < syms[j].end {
			return syms[j].name
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// separate debug files

var debugRoots = []string{"/usr/lib/debug"}

func openDebugFile(f *elf.File, path string) *elf.File {
	if id := buildID(f); id != "" && len(id) > 2 {
		for _, root := range debugRoots {
			p := filepath.Join(root, ".build-id", id[:2], id[2:]+".debug")
			if df, err := elf.Open(p); err == nil {
				return df
			}
		}
	}
	sec := f.Section(".gnu_debuglink")
	if sec == nil {
		return nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil
	}
	nul := bytes.IndexByte(data, 0)
	if nul <= 0 || len(data) < 4 {
		return nil
	}
	name := string(data[:nul])
	want := f.ByteOrder.Uint32(data[len(data)-4:])
	dir := filepath.Dir(path)
	cands := []string{filepath.Join(dir, name), filepath.Join(dir, ".debug", name)}
	for _, root := range debugRoots {
		cands = append(cands, filepath.Join(root, dir, name))
	}
	for _, p := range cands {
		if p == path {
			continue
		}
		fh, err := os.Open(p)
		if err != nil {
			continue
		}
		h := crc32.NewIEEE()
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil || h.Sum32() != want {
			continue
		}
		if df, err := elf.Open(p); err == nil {
			return df
		}
	}
	return nil
}

func buildID(f *elf.File) string {
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		return ""
	}
	data, err := sec.Data()
	if err != nil || len(data) < 16 {
		return ""
	}
	namesz := f.ByteOrder.Uint32(data[0:4])
	descsz := f.ByteOrder.Uint32(data[4:8])
	typ := f.ByteOrder.Uint32(data[8:12])
	off := 12 + (uint64(namesz)+3)&^3
	if typ != 3 || off+uint64(descsz) > uint64(len(data)) {
		return ""
	}
	return hex.EncodeToString(data[off : off+uint64(descsz)])
}

// ---------------------------------------------------------------------------
// DWARF

// addrRange maps [lo, hi) to an index.
type addrRange struct {
	lo, hi uint64
	idx    int
}

type lineRange struct {
	lo, hi uint64
	file   string // base name
	line   int
}

type subprogram struct {
	lo, hi uint64
	name   string
}

type unit struct {
	entry *dwarf.Entry
	// Built lazily on first hit.
	parsed bool
	lines  []lineRange  // sorted by lo
	funcs  []subprogram // sorted by lo
}

type dwarfIndex struct {
	d        *dwarf.Data
	units    []*unit
	ranges   []addrRange // unit address ranges, sorted by lo
	rangless []int       // units without DW_AT_ranges/low_pc, resolved on a miss
}

func newDwarfIndex(d *dwarf.Data) *dwarfIndex {
	x := &dwarfIndex{d: d}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit {
			idx := len(x.units)
			x.units = append(x.units, &unit{entry: e})
			rs, _ := d.Ranges(e)
			n := 0
			for _, rg := range rs {
				if rg[0] != 0 && rg[1] > rg[0] {
					x.ranges = append(x.ranges, addrRange{rg[0], rg[1], idx})
					n++
				}
			}
			if n == 0 {
				x.rangless = append(x.rangless, idx)
			}
		}
		if e.Children {
			r.SkipChildren()
		}
	}
	sortRanges(x.ranges)
	return x
}

func sortRanges(rs []addrRange) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
}

func (x *dwarfIndex) findUnit(pc uint64) *unit {
	i := sort.Search(len(x.ranges), func(i int) bool { return x.ranges[i].lo > pc })
	for j := i - 1; j >= 0 && j >= i-8; j-- {
		if pc < x.ranges[j].hi {
			return x.units[x.ranges[j].idx]
		}
	}
	if len(x.rangless) > 0 {
		// Derive ranges of units lacking them from their line tables, once.
		for _, idx := range x.rangless {
			u := x.units[idx]
			x.parse(u)
			for _, l := range u.lines {
				x.ranges = append(x.ranges, addrRange{l.lo, l.hi, idx})
			}
		}
		x.rangless = nil
		sortRanges(x.ranges)
		return x.findUnit(pc)
	}
	return nil
}

func (x *dwarfIndex) lookup(pc uint64) (fn, file string, line int) {
	u := x.findUnit(pc)
	if u == nil {
		return "", "", 0
	}
	x.parse(u)
	i := sort.Search(len(u.lines), func(i int) bool { return u.lines[i].lo > pc })
	for j := i - 1; j >= 0 && j >= i-8; j-- {
		if l := u.lines[j]; pc < l.hi {
			file, line = l.file, l.line
			break
		}
	}
	i = sort.Search(len(u.funcs), func(i int) bool { return u.funcs[i].lo > pc })
	for j := i - 1; j >= 0 && j >= i-16; j-- {
		if f := u.funcs[j]; pc < f.hi {
			fn = f.name
			break
		}
	}
	return fn, file, line
}

// parse builds the unit's line and function tables.
func (x *dwarfIndex) parse(u *unit) {
	if u.parsed {
		return
	}
	u.parsed = true
	u.lines = readLines(x.d, u.entry)
	u.funcs = readFuncs(x.d, u.entry)
}

func readLines(d *dwarf.Data, cu *dwarf.Entry) []lineRange {
	lr, err := d.LineReader(cu)
	if err != nil || lr == nil {
		return nil
	}
	var out []lineRange
	var prev dwarf.LineEntry
	have := false
	base := map[*dwarf.LineFile]string{}
	for {
		var le dwarf.LineEntry
		if err := lr.Next(&le); err != nil {
			break
		}
		if have && le.Address > prev.Address && prev.Address != 0 && prev.Line > 0 {
			name := ""
			if prev.File != nil {
				var ok bool
				if name, ok = base[prev.File]; !ok {
					name = filepath.Base(prev.File.Name)
					base[prev.File] = name
				}
			}
			out = append(out, lineRange{prev.Address, le.Address, name, prev.Line})
		}
		prev, have = le, !le.EndSequence
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	return out
}

func readFuncs(d *dwarf.Data, cu *dwarf.Entry) []subprogram {
	r := d.Reader()
	r.Seek(cu.Offset)
	if e, err := r.Next(); err != nil || e == nil || !e.Children {
		return nil
	}
	var out []subprogram
	depth := 1
	for depth > 0 {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		if e.Tag == 0 {
			depth--
			continue
		}
		if e.Tag == dwarf.TagSubprogram {
			if rs, err := d.Ranges(e); err == nil && len(rs) > 0 {
				if name := funcName(d, e); name != "" {
					for _, rg := range rs {
						if rg[0] != 0 && rg[1] > rg[0] {
							out = append(out, subprogram{rg[0], rg[1], name})
						}
					}
				}
			}
		}
		if e.Children {
			// Subprograms may nest (namespaces, GNU C nested functions,
			// C++ local classes): descend everywhere.
			depth++
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	return out
}

// funcName prefers the linkage (mangled) name, which matches the symbol
// table, then DW_AT_name, following abstract_origin/specification.
func funcName(d *dwarf.Data, e *dwarf.Entry) string {
	for hop := 0; hop < 4 && e != nil; hop++ {
		if n, ok := e.Val(dwarf.AttrLinkageName).(string); ok && n != "" {
			return n
		}
		if n, ok := e.Val(dwarf.AttrName).(string); ok && n != "" {
			return n
		}
		off, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset)
		if !ok {
			if off, ok = e.Val(dwarf.AttrSpecification).(dwarf.Offset); !ok {
				return ""
			}
		}
		r := d.Reader()
		r.Seek(off)
		e, _ = r.Next()
	}
	return ""
}
