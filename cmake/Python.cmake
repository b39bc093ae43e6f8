# zs_python_print(VAR CODE): VAR = what CODE prints in the build's interpreter (empty if
# it fails). -I (isolated mode): under pip's build isolation the interpreter's own
# site-packages (torch, the nvidia-* wheels) are hidden through PYTHON* variables,
# which -I ignores. Run from / so that no folder of this tree shadows a package.
function(zs_python_print var code)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -I -c "${code}" WORKING_DIRECTORY /
                  OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

# ZS_TORCH_RPATH: where an installed wheel's binaries (site-packages/zeroshard) find
# torch's libraries and the CUDA runtime torch itself loads (PyPI's torch takes it from an
# nvidia-* wheel: site-packages/nvidia/cu13/lib), by their places beside it; never a CUDA
# toolkit's. torch is imported before zeroshard, so these are loaded already when Python
# imports it; the run path makes ldd, and a program that loads the module alone, agree.
zs_python_print(ZS_TORCH_RPATH [=[
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
libs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
libs += sorted({os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so.*"))})
print(";".join("$ORIGIN/../" + os.path.relpath(p, site) for p in libs))]=])
