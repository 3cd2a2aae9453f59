// The bindings' functions as PyTorch operators (torch.ops.<extension name>.<function>), beside the pybind11
// module: a registered operator has a schema that says which arguments it writes, so torch.compile traces
// through it without a graph break, and torch.library.opcheck can test it (common/operators.py adds the fake
// implementations that tracing needs).
//
// Each build registers its own namespace, the extension's name (task4_student, task4_solution, ...), so a
// student's operators and the reference's never meet. TORCH_LIBRARY pastes its namespace argument into names,
// which keeps a macro given there from being expanded: these macros expand TORCH_EXTENSION_NAME first.
//
// The same function is registered for CUDA and for CPU tensors: a CPU tensor then reaches the binding's own
// check ("q must be a CUDA tensor ...") instead of the dispatcher's "could not run ... on the CPU backend".
#pragma once

#include <torch/library.h>

#define KIT_LIBRARY_OF(ns, m) TORCH_LIBRARY(ns, m)
#define KIT_LIBRARY_IMPL_OF(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define KIT_OPERATORS(m) KIT_LIBRARY_OF(TORCH_EXTENSION_NAME, m)

// KIT_OPERATOR_IMPLS(register_impls): the binding's `void register_impls(torch::Library& m)` (its m.impl calls)
// registered for CUDA tensors and for CPU tensors alike.
#define KIT_OPERATOR_IMPLS(register_impls)                                             \
  KIT_LIBRARY_IMPL_OF(TORCH_EXTENSION_NAME, CUDA, m) { register_impls(m); }            \
  KIT_LIBRARY_IMPL_OF(TORCH_EXTENSION_NAME, CPU, m) { register_impls(m); }
