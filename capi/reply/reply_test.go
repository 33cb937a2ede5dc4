package reply

import (
	"errors"
	"testing"
)

func TestShapes(t *testing.T) {
	value := Always("ValueError")
	for _, c := range []struct {
		got  []byte
		want string
	}{
		{Encode([]string{"leaks"}, "", nil, value), `{"ok":true,"result":["leaks"]}`},
		{Encode(nil, "", nil, value), `{"ok":true,"result":null}`},
		{Encode("", "", nil, value), `{"ok":true,"result":""}`},
		{Encode(map[string]int{"n": 1}, "report\n", nil, value), `{"ok":true,"result":{"n":1},"text":"report\n"}`},
		{Encode(nil, "", errors.New("bad \"x\""), value), `{"ok":false,"type":"ValueError","error":"bad \"x\""}`},
		{Encode(func() {}, "", nil, value), `{"ok":false,"type":"RuntimeError","error":"cannot encode the result: json: unsupported type: func()"}`},
		{Run(value, func() (any, string, error) { panic("boom") }), `{"ok":false,"type":"RuntimeError","error":"msmemscope internal error: boom"}`},
		{Run(Always("TypeError"), func() (any, string, error) { return nil, "", errors.New("no") }), `{"ok":false,"type":"TypeError","error":"no"}`},
		{Run(value, func() (any, string, error) { return 7, "", nil }), `{"ok":true,"result":7}`},
	} {
		if string(c.got) != c.want {
			t.Errorf("got  %s\nwant %s", c.got, c.want)
		}
	}
}
