package main

import "syscall"

var syscallZero = syscall.Signal(0)
