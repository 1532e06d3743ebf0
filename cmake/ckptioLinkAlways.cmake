# The link feature CKPTIO_ALWAYS: $<LINK_LIBRARY:CKPTIO_ALWAYS,lib> links
# `lib` in whole whether it is static (--whole-archive: every object,
# referenced or not) or shared (--no-as-needed: loaded even though no symbol
# of it is named). ckptio's backends register their URI schemes from static
# initializers that nothing calls by name, so without this a program linked
# against ckptio::ckptio would find no backend. Each flag is a no-op on the
# other kind of library. Included by the build and by ckptioConfig.cmake.
set(CMAKE_LINK_LIBRARY_USING_CKPTIO_ALWAYS
    "LINKER:--push-state,--whole-archive,--no-as-needed" "<LINK_ITEM>" "LINKER:--pop-state")
set(CMAKE_LINK_LIBRARY_USING_CKPTIO_ALWAYS_SUPPORTED TRUE)
