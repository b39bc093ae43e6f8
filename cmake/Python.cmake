# zs_python_print(VAR CODE): VAR = what CODE prints in the build's interpreter (empty if
# it fails). -I (isolated mode): under pip's build isolation the interpreter's own
# site-packages (torch, the nvidia-* wheels) are hidden through PYTHON* variables,
# which -I ignores. Run from / so that no folder of this tree shadows a package.
function(zs_python_print var code)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -I -c "${code}" WORKING_DIRECTORY /
                  OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
