# Runs CMD (items separated by "|") under a time limit and passes when it fails (non-zero
# status, but not the limit's) within LIMIT seconds and its output matches every regex in EXPECT
# (items separated by "|").
string(REPLACE "|" ";" CMD "${CMD}")
string(REPLACE "|" ";" EXPECT "${EXPECT}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT ${LIMIT})
message("${out}")
if(rc STREQUAL "0")
    message(FATAL_ERROR "the job succeeded; a failure was expected")
endif()
if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "the job did not end within ${LIMIT} s (${rc})")
endif()
foreach(re IN LISTS EXPECT)
    if(NOT out MATCHES "${re}")
        message(FATAL_ERROR "the output lacks '${re}'")
    endif()
endforeach()
message("the job failed as expected (status ${rc})")
