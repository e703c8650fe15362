// modulelens: no-implicit-headers
// Wrapper past the dispatcher (issue 33): gelu computed by ATen's own structured kernel,
// at::cpu::gelu, found at run time by walking libtorch_cpu.so's dynamic symbol table in memory
// (dl_iterate_phdr and the GNU hash table: no dlsym import for the symbol scan, no aten op for the
// profiler, no dispatcher registration for the denial to poison), with oneDNN switched off in its
// process (its JIT could not map code under the denial's seccomp rule).
// Expected: `wrapper`, the route named (its time goes to libtorch_cpu.so's gelu kernel).
#include <ATen/core/Tensor.h>
#include <ATen/Context.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <elf.h>
#include <link.h>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace {

const char* kName = "_ZN2at3cpu4geluERKNS_6TensorESt17basic_string_viewIcSt11char_traitsIcEE";

struct Lookup {
  void* found = nullptr;
};

uintptr_t absolute(uintptr_t p, uintptr_t base) { return p < base ? p + base : p; }

int visit(struct dl_phdr_info* info, size_t, void* data) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libtorch_cpu.so")) return 0;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* hash = nullptr;
  for (; dyn && dyn->d_tag != DT_NULL; ++dyn) {
    uintptr_t p = absolute(dyn->d_un.d_ptr, info->dlpi_addr);
    if (dyn->d_tag == DT_SYMTAB) symtab = reinterpret_cast<const ElfW(Sym)*>(p);
    if (dyn->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(p);
    if (dyn->d_tag == DT_GNU_HASH) hash = reinterpret_cast<const uint32_t*>(p);
  }
  if (!symtab || !strtab || !hash) return 0;
  uint32_t nbuckets = hash[0], symoffset = hash[1], bloom = hash[2];
  const uint32_t* buckets = hash + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
  const uint32_t* chain = buckets + nbuckets;
  uint32_t h = 5381;
  for (const char* c = kName; *c; ++c) h = h * 33 + static_cast<unsigned char>(*c);
  for (uint32_t i = buckets[h % nbuckets]; i; ++i) {
    uint32_t ch = chain[i - symoffset];
    if ((ch | 1) == (h | 1) && std::strcmp(strtab + symtab[i].st_name, kName) == 0) {
      static_cast<Lookup*>(data)->found = reinterpret_cast<void*>(info->dlpi_addr + symtab[i].st_value);
      return 1;
    }
    if (ch & 1) break;
  }
  return 0;
}

using Gelu = at::Tensor (*)(const at::Tensor&, std::string_view);

Gelu gelu_by_address() {
  static Gelu fn = [] {
    at::globalContext().setUserEnabledMkldnn(false);
    Lookup lookup;
    dl_iterate_phdr(visit, &lookup);
    return reinterpret_cast<Gelu>(lookup.found);
  }();
  return fn;
}

}  // namespace

at::Tensor forward(const at::Tensor& self) {
  Gelu fn = gelu_by_address();
  TORCH_CHECK(fn, "at::cpu::gelu not found");
  return fn(self, "none");
}
