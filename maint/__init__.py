"""A maintainer's actions, apart from the release's stages: regenerate the locks (`lock`), run the
workflow here (`ci_local`), mutation-test the audit rules (`mutants`), the GPU machine's one script
(`gpu_check.sh`)."""
