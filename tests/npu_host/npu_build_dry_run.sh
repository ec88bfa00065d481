#!/usr/bin/env bash
# setup.py's NPU branch without CANN: stand-ins for what only a CANN toolkit has (the AscendC
# compiler's presence, libascendcl.so, CANN's CMake build of the kernels: the aclrtlaunch_*.h
# headers written from the kernels' signatures and a kernel library of empty launch functions)
# and a torch_npu package made of the real wheel's cpp_extension.py, headers and
# libtorch_npu.so (tests/_npu_host.py's cache). Then `setup.py build_ext` must build
# pasa_npu._npu with torch_npu's NpuExtension, link it against those libraries, copy the kernel
# library next to it and record "built for Ascend910B1". About 80 s of CPU (the emulation and
# the binding compile); not part of the test suite. Run from the repository root in the venv.
set -euo pipefail
ROOT=$PWD
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
WHEEL=$(cd tests && python -c "import _npu_host; print(_npu_host.torch_npu_wheel() / 'torch_npu')")

mkdir -p "$W/cann/compiler/ccec_compiler/bin" "$W/cann/compiler/tikcpp/ascendc_kernel_cmake" \
         "$W/cann/include" "$W/cann/lib64" "$W/bin" "$W/py/torch_npu/utils"
touch "$W/cann/compiler/ccec_compiler/bin/bisheng"
cp -r "$WHEEL/include/third_party/acl/inc/acl" "$W/cann/include/"
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
    'int aclrtMemcpyAsync(void* d, size_t m, const void* s, size_t c, int k, void* st) { return 0; }' \
    'int aclrtGetDeviceInfo(uint32_t d, int a, int64_t* v) { *v = 24; return 0; }' > "$W/acl.c"
gcc -shared -fPIC "$W/acl.c" -o "$W/cann/lib64/libascendcl.so"

python - "$W/kernels.c" <<'EOF'
import sys
sys.path.insert(0, "tests")
import _npu_host
with open(sys.argv[1], "w") as f:
    f.write("#include <stdint.h>\n")
    for name, params in _npu_host.kernel_signatures().items():
        args = ", ".join(f"void* {arg}" for _, arg in params)
        f.write(f"uint32_t aclrtlaunch_{name}(uint32_t blockDim, void* stream, {args}) {{ return 0; }}\n")
EOF
cat > "$W/bin/cmake" <<EOF
#!/usr/bin/env bash
while [ \$# -gt 0 ]; do case "\$1" in -B) B="\$2"; shift;; --build) exit 0;; esac; shift; done
mkdir -p "\$B/include/pasa_npu_kernels" "\$B/lib"
(cd "$ROOT/tests" && python -c "import _npu_host, pathlib; _npu_host.write_launch_headers(pathlib.Path('\$B/include/pasa_npu_kernels'))")
gcc -shared -fPIC "$W/kernels.c" -o "\$B/lib/libpasa_npu_kernels.so"
EOF
chmod +x "$W/bin/cmake"

touch "$W/py/torch_npu/__init__.py" "$W/py/torch_npu/utils/__init__.py"
cp "$WHEEL/utils/cpp_extension.py" "$W/py/torch_npu/utils/"
ln -s "$WHEEL/include" "$W/py/torch_npu/include"
ln -s "$WHEEL/lib" "$W/py/torch_npu/lib"

env ASCEND_HOME_PATH="$W/cann" PATH="$W/bin:$PATH" PYTHONPATH="$W/py" PASA_NPU_BUILD=1 \
    python setup.py -q build_ext --build-lib "$W/out" --build-temp "$W/tmp" 2>&1 | grep 'pasa_npu:'
OUT="$W/out/pasa_npu"
test "$(cat "$OUT/_npu_build_status.txt")" = "built for Ascend910B1"
test -f "$OUT/libpasa_npu_kernels.so"
readelf -d "$OUT"/_npu.*.so | grep 'RUNPATH.*\$ORIGIN' > /dev/null
readelf -d "$OUT"/_npu.*.so | grep 'NEEDED.*libpasa_npu_kernels.so' > /dev/null
nm -D "$OUT"/_npu.*.so | grep 'T PyInit__npu' > /dev/null
echo "npu build dry run: pasa_npu._npu built and linked; status: $(cat "$OUT/_npu_build_status.txt")"
