module github.com/rtproxy/rtproxy/operators/jsonbench

go 1.26.8

require (
	github.com/bytedance/gopkg v0.1.3 // indirect
	github.com/bytedance/sonic/loader v0.5.3 // indirect
	github.com/cloudwego/base64x v0.1.6 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/klauspost/cpuid/v2 v2.2.9 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.3.0 // indirect
	github.com/twitchyliquid64/golang-asm v0.15.1 // indirect
	golang.org/x/arch v0.0.0-20210923205945-b76863e36670 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/bytedance/sonic v1.15.5
	github.com/goccy/go-json v0.12.0
	github.com/json-iterator/go v1.1.12
	github.com/minio/simdjson-go v0.4.5
	github.com/rtproxy/rtproxy v0.0.0
	github.com/tidwall/gjson v1.20.2
	github.com/tidwall/sjson v1.2.9
	github.com/valyala/fastjson v1.6.10
)

replace github.com/rtproxy/rtproxy => ../..
