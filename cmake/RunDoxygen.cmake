# Runs doxygen on DOXYFILE (cmake/Doxygen.cmake) and fails when it warned: the warnings log must be
# empty. Without doxygen it fails with "doxygen not found", which docs.api_reference counts as
# skipped (SKIP_REGULAR_EXPRESSION).
if(NOT DOXYGEN)
  message(FATAL_ERROR "doxygen not found; scripts/setup-deps.sh installs it")
endif()
file(REMOVE_RECURSE ${OUT_DIR}/html)
file(REMOVE ${OUT_DIR}/warnings.log)
execute_process(COMMAND ${DOXYGEN} ${DOXYFILE} WORKING_DIRECTORY ${OUT_DIR} RESULT_VARIABLE rc
  OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doxygen failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${OUT_DIR}/warnings.log warnings)
if(NOT warnings STREQUAL "")
  message(FATAL_ERROR "doxygen warned (${OUT_DIR}/warnings.log):\n${warnings}")
endif()
if(NOT EXISTS ${OUT_DIR}/html/index.html)
  message(FATAL_ERROR "doxygen wrote no ${OUT_DIR}/html/index.html")
endif()
message(STATUS "API reference: ${OUT_DIR}/html/index.html")
